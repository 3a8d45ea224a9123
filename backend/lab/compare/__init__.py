"""Computations behind the "Contiguous vs paged" page, without Streamlit.

    seed_example  the seed text's 6 / 3 / 5-token example in both memories
    memory_maps   one workload replayed through both memories, frame by frame
    block_sizes   tail waste against block-table entries over block sizes

May import: the rest of lab, paging and core (backend.lab's). Entry points: each
module's functions, turned into frames and charts by backend.views.compare.
"""
