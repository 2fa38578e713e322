"""The composed reference trainer (compose: every dimension at once), its dimensions and its topology."""
