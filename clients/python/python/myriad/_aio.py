"""Helper the extension uses to resolve asyncio futures from its runtime's threads."""


def _resolve(future, ok, value):
    """Sets ``future``'s result (``ok``) or exception, unless it was cancelled meanwhile.

    Called through ``loop.call_soon_threadsafe`` so that it runs on the loop's thread.
    """
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
