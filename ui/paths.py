"""The pages' addresses (their url paths), for app.py, ui.start and the browser's history.

Written out here, not read from the pages: a process that multiprocessing spawns from
the server (the simulator's sweep) runs app.py bare, where a Page has no url path. This
module imports nothing, so app.py can read it before its slow imports.

Each differs from its page file's name on purpose (see app.py).
"""

from __future__ import annotations

PLAYGROUND = "lab"          # the address that names a saved session (ui.store)
SCENARIOS = "tour"          # the page a scenario plays on
COMPARE = "fragmentation"

# Every page's, in the navigation's order: any other address only opens one of them.
PAGES = (PLAYGROUND, SCENARIOS, COMPARE)
