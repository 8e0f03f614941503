# Images the tests and the demo run, included by the Makefile.
#   make images          build what changed (each image is skipped when its inputs hash is unchanged)
#   make images-force    rebuild every image (not the base)
#   make base-image      only denv-python-base:3.11 (python:3.11-slim, or built offline)
#   make images-remove   remove every image this project builds, and their stamps (CI starts so)
# images/build.sh keys each image on a hash of its folder, uv.lock, the denv sources it
# embeds and the base image id (stamps in .cache/images/), so `make images` is a few
# seconds when nothing changed. images/openenv-template.sh does the same for the env that
# OpenEnv's `openenv init` generates, built by the Dockerfile it generates.

IMAGE_BUILD := images/build.sh
# The venv provides uv, which builds the denv wheel and reads uv.lock's pins.
IMAGES_VENV := $(if $(VENV_STAMP),$(VENV_STAMP),.venv/bin/uv)

.PHONY: images images-force images-remove base-image image-echo image-redis image-redis-counter image-standin image-probe \
  image-openenv-base image-openenv-template image-shapes image-node

images: image-echo image-redis image-redis-counter image-standin image-probe image-shapes image-node
	@docker images --format '  {{.Repository}}:{{.Tag}}\t{{.Size}}' | grep -E '^  denv-' >&2 || true

# Every image the targets below build: images-remove takes exactly these, nothing else.
PROJECT_IMAGES := denv-python-base:3.11 denv-echo-env:latest denv-redis:latest \
  denv-redis-counter-env:latest denv-http-standin:latest denv-base-probe:latest \
  denv-openenv-base:latest denv-openenv-template:latest denv-shapes-env:latest \
  denv-node-env:latest

images-remove: docker
	@present=$$(for i in $(PROJECT_IMAGES); do docker image inspect -f '{{.Id}}' $$i >/dev/null 2>&1 && echo $$i; done); \
	if [ -n "$$present" ]; then echo "removing images: $$present" >&2; docker image rm -f $$present >/dev/null; \
	else echo "none of this project's images is on the engine" >&2; fi
	rm -rf .cache/images

images-force:
	@$(MAKE) --no-print-directory images IMAGE_FLAGS=--force

base-image:
	scripts/ensure-docker.sh
	scripts/base-image.sh

image-echo: base-image $(IMAGES_VENV)
	$(IMAGE_BUILD) $(IMAGE_FLAGS) -t denv-echo-env:latest --with-denv envs/echo

image-redis: base-image
	$(IMAGE_BUILD) $(IMAGE_FLAGS) -t denv-redis:latest envs/redis-counter/redis

image-redis-counter: base-image $(IMAGES_VENV)
	$(IMAGE_BUILD) $(IMAGE_FLAGS) -t denv-redis-counter-env:latest --pins envs/redis-counter/agent

image-standin: base-image
	$(IMAGE_BUILD) $(IMAGE_FLAGS) -t denv-http-standin:latest envs/http-standin

# The shapes real envs have (uvicorn[standard], so uvloop; a single session; files outside
# /work), FROM the echo image: tests/e2e/test_live_shapes.py builds its start forms on it.
image-shapes: image-echo
	DENV_BASE_IMAGE=denv-echo-env:latest $(IMAGE_BUILD) $(IMAGE_FLAGS) -t denv-shapes-env:latest --pins envs/shapes

# An env that is not Python: plain Node.js from Debian's nodejs (apt), its episode under /work
# (tests/e2e/test_gvisor_shapes.py forks it under gvisor).
image-node: base-image
	$(IMAGE_BUILD) $(IMAGE_FLAGS) -t denv-node-env:latest envs/node

# The server's e2e and reliability tests run stdlib Python and sh in the base image.
image-probe: base-image
	$(IMAGE_BUILD) $(IMAGE_FLAGS) -t denv-base-probe:latest images/probe

# A local stand-in for OpenEnv's base image (ghcr.io/huggingface/openenv-base): uv, curl, the CA.
image-openenv-base: base-image
	$(IMAGE_BUILD) $(IMAGE_FLAGS) -t denv-openenv-base:latest images/openenv-base

# The env `openenv init` generates (from the venv's openenv), built by its own Dockerfile
# (the tests' image of OpenEnv's echo env as OpenEnv builds it: `make test` builds it, the demo
# does not),
# unmodified; that Dockerfile needs BuildKit, which Compose v2 brings here.
image-openenv-template: image-openenv-base compose $(IMAGES_VENV)
	images/openenv-template.sh $(IMAGE_FLAGS)
