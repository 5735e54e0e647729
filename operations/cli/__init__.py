"""The command lines a user runs on the controller (`python -m operations.plan`, `.status`,
`.releases`, `.lock`, `.kb`): argument parsing and printing only; each calls the plan or a fact."""
