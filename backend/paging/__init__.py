"""The paged KV-cache allocator: bookkeeping only, no tensors.

    block_pool     blocks, reference counts, the free queue (also the LRU eviction
                   order of cached blocks) and the prefix cache's content index
    block_tables   per-request block tables and the manager's read-only queries
    block_manager  allocate / append / fork / free, copy-on-write, prefix hits
    remap          moving every used block (the `shuffle` operation's plan)
    checks         argument checks (ids, pins, sizes) raising PagedLabError
    hashing        chained block hashes; events, block_types: its typed results
    integrity      `check_integrity`, a from-scratch proof of every invariant

May import: backend.core only, and neither torch nor triton (a pure-Python
allocator, O(1) per block). Entry point: `block_manager.BlockManager`.
"""
