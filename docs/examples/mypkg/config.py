"""A package of your own, for the examples of docs/writing-patches.md (patch.field)."""
from dataclasses import dataclass


@dataclass
class Settings:
    name: str = "default"
    timeout: float = 10.0
