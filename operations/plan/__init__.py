"""The plan: every pure decision, from settings, the knowledge base and the gathered facts to
typed plans that the steps carry out (`host_plan.decide`). Nothing here reads a file on the
host, draws a random number or asks pyinfra anything. `python -m operations.plan` shows it."""
