"""What a browser session drives, without Streamlit: the pages' state machines.

    playground  the Playground's engine with its operation history and settings
    tour        a scenario walked step by step, kept for time travel

The top layer: may import io, views and everything below. ui/ holds the
Streamlit side of the same sessions.
"""
