"""Tools over context models that need the EPs: ``inspect`` (what a context model holds, every EPContext
node's payload recognised by the EP that wrote it) and payload recognition. Above ``providers/`` so that they
ask the registry directly; the session never imports them."""
