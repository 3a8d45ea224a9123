"""/lab on a fresh server: runs app.py, which opens the Playground page.

A server's first run, and every AppTest run, goes through Streamlit's legacy pages/
lookup before app.py's st.navigation: that lookup knows a page only by its file name,
and without a file named lab.py it would report "Page not found" for /lab (and
then run app.py anyway). This file gives it the name; what runs is the app as usual.
"""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "app.py"), run_name="__main__")
