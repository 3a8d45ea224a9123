"""The size limit a file uploader is given, above the limit PagedLab checks itself.

Streamlit refuses a file past its uploader's `max_upload_size` in the browser, with a
red mark on the file's chip whose reason shows only under the pointer, nothing on the
page and nothing a screen reader is told. So the uploader takes twice PagedLab's own
limit, and a file past that one reaches the page's check, which says on the page
what the file's size is and what the limit is. Only a file past twice the limit is
left to Streamlit's mark.
"""

from __future__ import annotations

HEADROOM = 2


def uploader_mib(limit_bytes: int) -> int:
    """`max_upload_size` (MiB, as Streamlit counts it) for PagedLab's limit of
    `limit_bytes`: HEADROOM times it, rounded up to a whole MiB."""
    return -(-HEADROOM * limit_bytes // (1 << 20))


def limit_help(limit_bytes: int) -> str:
    """The sentence an uploader's help ends with: PagedLab's limit, which the uploader's
    own line ("... MB per file") shows HEADROOM times over."""
    return (f" At most {limit_bytes >> 20} MiB: the uploader's own line allows more so that "
            "a larger file is refused here with its size, not only marked red on its chip.")
