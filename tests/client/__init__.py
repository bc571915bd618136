"""The client (`client/`): its sans-IO decisions, its WebSocket, and its API against real nodes."""
