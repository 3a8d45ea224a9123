"""What a browser session drives, without Streamlit: the pages' state machines.

    playground  the Playground's engine with its operation history and settings
    tour        a scenario walked step by step, kept for time travel

    budget      the server's K/V budget: what each session's engines may hold
    saved, store  sessions saved in SQLite, resumed after a reload or a restart
    history, oplog  a session's past states and operations, for time travel and replay
    forms       the sidebar's fields as a config or an operation, refused by name
    progress    a long operation's progress and its Stop, read by the page's bar

The top layer: may import io, views and everything below. ui/ holds the
Streamlit side of the same sessions. Entry points: `playground.build_engine`,
`tour.TourRun`, `saved.open_saved`, `budget.SERVER_BUDGET`.
"""
