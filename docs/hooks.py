"""MkDocs hooks: the site's front page is README.md.

README is the repository's front page on GitHub and the site's `index.md`, made
here at build time rather than copied, so the two never differ. Its links into
the guides are written `docs/x.md` (right on GitHub); in the site, where `docs/`
is the root, they become `x.md`, and MkDocs then checks them like any other link.
"""

import os
import re

from mkdocs.structure.files import File

_DOCS_LINK = re.compile(r"\]\(docs/")


def on_files(files, config):
  root = os.path.dirname(config.config_file_path)
  with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  files.append(File.generated(config, "index.md", content=_DOCS_LINK.sub("](", readme)))
  return files
