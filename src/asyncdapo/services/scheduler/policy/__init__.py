"""The scheduler's pure policies: functions and small value classes with no I/O, no clock of their
own and no asyncio — admission (may one more prompt be taken?), dispatch (filter → score → pick a
gateway), commit order (which complete valid groups go to the trainer, and early stop) and the
long-tail policy (pdsr's window and cap). The rollout core calls them; the simulator reuses them."""
