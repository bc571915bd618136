"""The pure cores (`cluster/`): every rule, without trio, sockets or a clock."""
