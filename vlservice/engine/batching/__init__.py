"""A request's life on the model's side: the one thread that runs the language model
(`scheduler`, its rules pure functions in `policy`), each admitted request's sequences
(`sequence`), the `Generation` its caller reads and the scheduler publishes to, and each API
key's fair share of the places (`tenants`)."""
