"""The adapter that holds our own composed trainer (reference.stack.compose) to the stack contract."""
