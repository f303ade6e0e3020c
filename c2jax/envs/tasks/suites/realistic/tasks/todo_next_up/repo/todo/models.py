from dataclasses import dataclass


@dataclass
class Task:
    title: str
    priority: int = 2  # 1 is the most urgent
    done: bool = False
