"""Live forks in the lifecycle: a live env's children recorded (``forks``), the children that
do not fit on their parent's node (``spill``), and zygotes, an idle live root per
configuration copied into new envs (``zygotes``; what one imports before its first copy:
``preload``). The rules are the seam's (``node.live``); the mechanism is the node's
(``docker.live``)."""
