"""MkDocs hook: the built site asks nothing of the network.

mkdocs-material's ``offline`` plugin loads the iframe-worker shim (its search worker for pages
opened from ``file://``) from unpkg.com; each page here loads the copy in
``docs/assets/iframe-worker-shim.js`` instead (by a path relative to the page), so search works
from ``file://`` with no network, as it does served (``make serve-docs``).
"""
from __future__ import annotations

SHIM_URL = "https://unpkg.com/iframe-worker/shim"
SHIM_FILE = "assets/iframe-worker-shim.js"


def on_post_page(output: str, page, config) -> str:
    """The page's HTML with the shim's unpkg URL replaced by the local copy's relative path."""
    if SHIM_URL not in output:
        return output
    depth = page.file.dest_uri.count("/")
    return output.replace(SHIM_URL, "../" * depth + SHIM_FILE)


def on_post_template(output_content: str, template_name: str, config) -> str:
    """The same for the static pages (404.html, at the site's root)."""
    return output_content.replace(SHIM_URL, SHIM_FILE)
