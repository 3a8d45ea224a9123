"""View models for the "Contiguous vs paged" page: frames, Altair charts and tables.

Pure functions of backend.lab's results; no Streamlit.
"""
