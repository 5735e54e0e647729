"""Facts: what a host says, one pyinfra fact class per remote query, each with a pure parser
(`process`) from the command's output to typed values. Gathered once per host and run
(`once`), handed to the plan as values (plan/host_plan.py `Gathered`); the decisions about them
belong to the plan."""
