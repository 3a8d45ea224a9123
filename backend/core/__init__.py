"""What every layer shares: `PagedLabError` (a refusal a user can act on) and `EngineConfig`.

Imports nothing else of the backend (config imports errors). Entry points:
`core.errors.PagedLabError`, `core.config.EngineConfig.from_json`.
"""
