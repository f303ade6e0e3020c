from events.bus import EventBus

__all__ = ["EventBus"]
