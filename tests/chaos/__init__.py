"""Chaos suite: worker processes, a fault scheduler and a checker that prove mutual exclusion and fencing."""
