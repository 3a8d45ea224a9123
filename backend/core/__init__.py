"""What every layer shares: `PagedLabError` (a refusal a user can act on), `EngineConfig`
and the scheduler budgets (`core.budgets`) that the engine and the simulator both apply.

Imports nothing else of the backend (config and budgets import errors). Entry points:
`core.errors.PagedLabError`, `core.config.EngineConfig.from_json`.
"""
