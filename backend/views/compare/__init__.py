"""View models for the "Contiguous vs paged" page: frames, Altair charts and tables.

Pure functions of backend.lab's results; no Streamlit.

    frames, tables  the tabs' DataFrames and tables; charts: their Altair charts
    seed            the seed text's example in both memories
    timeline        a trace replay's per-iteration memory, for its charts
    deployment      the real-deployment preset's words and its Figure 13 chart
    preemptions     why the paged simulator preempts as often as it does
    swap_recompute  swap against recompute on the engine, by block size

May import: lab, engine (the sharing and swap runs' results), the rest of views,
and core. Entry points: each module's functions, called by ui/compare/.
"""
