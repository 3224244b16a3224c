"""One seed on its own virtual-time event loop."""

from __future__ import annotations

import logging

import looptime
from loguru import logger

from .world import Failure, Simulation


def run_seed(seed: int) -> Failure | None:
    """Run `seed` to the end; the failure it found, or None."""
    loop = looptime.new_event_loop(start=0.0, noop_cycles=0)
    logger.disable("exporter")
    try:
        loop.run_until_complete(Simulation(seed).run())
    except Failure as failure:
        return failure
    finally:
        logger.enable("exporter")
        loop.close()
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    return None
