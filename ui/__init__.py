"""Streamlit components of PagedLab's pages (the only package besides pages/ that imports st)."""
