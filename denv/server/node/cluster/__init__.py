"""Many nodes behind the one ``Node`` seam: placement, routing, layer movement, durability.

``denv serve --cluster`` gives the server's lifecycle code a ``ClusterNode`` (``node``) where
one machine gives it a ``DockerNode``; nothing above the seam knows the difference. The
members are ``Node`` objects by name: on a Ray cluster each is a ``RemoteNode`` talking to the
node agent pinned to its machine (``denv.cluster``, which imports this, never the reverse); in
tests they may be ``DockerNode`` objects, each with a state dir and instance label of its
own, on this machine's engine.

What it adds to the nodes it holds, each a part of its own (``node`` lists them):

* Placement (``placement``: a strategy, ``LeastLoaded`` by default). An env without layers
  goes to the member with the fewest envs (then the least memory in use) that has room; an
  env whose version has layers goes first to a member that already holds them all, then to
  the least loaded one, which fetches them before the env's volumes are mounted. ``room()``
  is what the members still accept, under each member's cap (``NodeCaps``): the server
  refuses a create past it with 429. Live children count on their group's member, which a
  live fork past its room cannot use (``room_beside``: the rest spill); a live root goes
  where its children will have room (``live_reserve``).
* Routing (``routing``). Every call about an env goes to the member it was placed on; calls
  about a live process go to its group's member; calls about everything (``owned``,
  ``states``, ``layer_ids``) merge every live member's answer.
* Layers (``layers``). A member that lacks a layer gets it from a live member that has it
  (its packed bytes, digest checked on arrival), else from object storage (digest checked);
  a layer that is in neither fails the boot (``start_failed``, naming the layer). Each new
  layer (a snapshot's, a seed) is uploaded in the background when there is a store; a
  version is ``durable`` once all its layers are stored.
* Images (``images``). A member that lacks an env's image gets it from its registry, a live
  member or the store before the env boots there.
* Loss (``membership``). A member that the membership callback no longer lists is lost (a
  ``NodeLost`` from a member asks the callback at once; a member still listed had a passing
  failure): its envs are reported by ``lost()`` (the reaper fails them with code ``lost``
  and the node's name), calls for them stop going out, and a version whose layers only it
  held is ``lost``. When a member of that name comes back, whatever it still holds that no
  live env owns is removed before it takes new envs.
"""
