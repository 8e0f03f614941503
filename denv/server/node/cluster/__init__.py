"""Many nodes behind the one ``Node`` seam: placement, routing, layer movement.

Used by ``denv serve --cluster``; the node agents themselves (Ray actors) are in the
``denv.cluster`` package, which imports this, never the reverse.
"""
