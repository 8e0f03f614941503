"""GRPO with TRL's `environment_factory` on denv envs, on the CPU, with no download.

TRL's `GRPOTrainer(environment_factory=...)` makes one environment object per rollout and
calls its `reset()` before each generation. Here each of those objects holds an OpenEnv client
of the echo env running on denv, and the G rollouts of one prompt (a GRPO group) share a
prefix: an episode stepped once in a root env per prompt. Instead of replaying that prefix G
times, each group is ONE denv fork of the root: one snapshot, G children that continue the
prefix's episode. The completion is then stepped in the rollout's own child and the env's
reward (the echo env pays 0.1 per character echoed) is the GRPO reward.

The policy is a tiny Qwen2 model with random weights, built from a config, and a BPE
tokenizer trained here on a few lines with the `tokenizers` library: nothing comes from a hub.
It learns nothing useful; the point is the real loop (generate, step real envs, score, update)
at a size that runs in CI.

    make trl-venv                                  # torch (CPU), TRL, transformers: .venv-trl
    .venv-trl/bin/python examples/trl_grpo.py --steps 2

Each step prints its mean reward and where its time went. Every env it starts is deleted at
the end, also when it fails. The server is the usual one (DENV_SERVER / DENV_API_KEY, else the
local `denv serve`, started when none runs).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import trl
from datasets import Dataset
from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    PrinterCallback,
    Qwen2Config,
    Qwen2ForCausalLM,
    TrainerCallback,
)
from trl import GRPOConfig, GRPOTrainer

IMAGE = "denv-echo-env:latest"
LABEL = {"example": "trl-grpo"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
CORPUS = [
    "echo the message back to me",
    "the environment answers with the message and its length",
    "say something short or say something long",
    "a fork starts from the prefix of the episode",
    "system user assistant tool call name arguments",
    '{"name": "echo", "arguments": {"message": "hello"}}',
]
PROMPTS = ["Say something to the echo env.", "Send a long message.", "Reply with one word."]


def say(text: str) -> None:
    print(text, flush=True)


# -- the policy: a tokenizer and a model made here


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on CORPUS, with Qwen2.5's chat template (shipped by TRL)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS + PROMPTS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
    )
    # TRL recognizes this template, so it can parse tool calls out of completions.
    template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    fast.chat_template = template.read_text()
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A two-layer Qwen2 with random weights (seeded)."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


# -- the envs: a root per prompt, a fork per group


class Groups:
    """The root env of each prompt's prefix, and the forked children not yet handed out.

    `take(prompt)` gives one child client; when none is left for that prompt it forks the
    root once into `group_size` children (one snapshot). GRPO resets the G rollouts of a prompt
    one after another, so each group is exactly one fork.
    """

    def __init__(self, image: str, group_size: int, prefix_steps: int, warm: int) -> None:
        self.image = image
        self.group_size = group_size
        self.prefix_steps = prefix_steps
        self.warm = warm
        self.roots: dict[str, Any] = {}
        self.pending: dict[str, deque[Any]] = {}
        self.fork_s = 0.0  # seconds spent forking, since the last `lap()`
        self.forks = 0
        self._lock = threading.Lock()

    def take(self, prompt: str) -> Any:
        with self._lock:
            queue = self.pending.setdefault(prompt, deque())
            if not queue:
                root = self.roots.get(prompt) or self._root(prompt)
                started = time.perf_counter()
                queue.extend(fork_clients(root, self.group_size))
                self.fork_s += time.perf_counter() - started
                self.forks += 1
            return queue.popleft()

    def _root(self, prompt: str) -> Any:
        """A root env for `prompt`, its episode stepped through the shared prefix."""
        provider = DenvProvider(warm=self.warm, labels=LABEL)
        client = GenericEnvClient.from_docker_image(self.image, provider=provider).sync()
        self.roots[prompt] = client
        client.reset()
        for i in range(self.prefix_steps):
            client.step({"message": f"{prompt} (prefix step {i})"})
        return client

    def lap(self) -> tuple[float, int]:
        with self._lock:
            lap = (self.fork_s, self.forks)
            self.fork_s, self.forks = 0.0, 0
            return lap

    def close(self) -> None:
        with self._lock:
            clients = [c for q in self.pending.values() for c in q] + list(self.roots.values())
            self.pending.clear()
            self.roots.clear()
        for client in clients:
            client.close()


GROUPS: Groups | None = None  # set in main(): TRL's factory takes no arguments
LIVE: list[EchoRollout] = []


class EchoRollout:
    """One rollout's environment, as TRL's `environment_factory` makes it.

    `reset` (called by TRL before each generation) swaps in a fresh child of the prompt's
    group; the public method `echo` is offered to the model as a tool.
    """

    def __init__(self) -> None:
        self.client: Any = None
        self.last_reward = 0.0
        LIVE.append(self)

    def reset(self, prompt: Any = None, **_: Any) -> str | None:
        assert GROUPS is not None
        if self.client is not None:
            self.client.close()  # deletes the previous rollout's env
        self.client = GROUPS.take(_text(prompt))
        self.last_reward = 0.0
        steps = self.client.state()["step_count"]
        return f" (the episode is at step {steps})"

    def echo(self, message: str) -> str:
        """Send a message to the echo environment.

        Args:
            message: The text to send.

        Returns:
            The text the environment echoed back.
        """
        result = self.client.step({"message": message})
        self.last_reward = float(result.reward or 0.0)
        return str((result.observation or {}).get("echoed_message", ""))

    def _close(self) -> None:  # private: TRL offers every public method as a tool
        if self.client is not None:
            self.client.close()
            self.client = None


def _text(prompt: Any) -> str:
    """The prompt's user text (TRL passes the example's conversational prompt)."""
    if isinstance(prompt, list):
        return str(prompt[-1]["content"])
    return str(prompt)


def env_reward(completions: list[Any], environments: list[EchoRollout], **_: Any) -> list[float]:
    """Each completion stepped in its rollout's own env; the env's reward is the reward."""
    rewards = []
    for completion, env in zip(completions, environments, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        env.echo(text.strip() or ".")
        rewards.append(env.last_reward)
    return rewards


class StepReport(TrainerCallback):  # type: ignore[misc]
    """One line per optimizer step: mean reward, step time and the part spent forking."""

    def __init__(self, groups: Groups) -> None:
        self.groups = groups
        self.started = 0.0
        self.lines: list[str] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if not logs or "reward" not in logs:
            return
        step_s = time.perf_counter() - self.started
        fork_s, forks = self.groups.lap()
        line = (
            f"step {state.global_step}: reward {logs['reward']:.3f} "
            f"(std {logs.get('reward_std', 0.0):.3f}), {step_s:.2f}s "
            f"({forks} forks in {fork_s:.2f}s), loss {logs.get('loss', 0.0):.4f}"
        )
        self.lines.append(line)
        say(line)


def main() -> int:
    global GROUPS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps")
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt (GRPO's G)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--prefix", type=int, default=8, help="env steps in the shared prefix")
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        help="booted spares per root, so its forks start warm (worth it when a step's "
        "generation takes long enough for the spares to boot again)",
    )
    parser.add_argument("--max-completion", type=int, default=16, help="tokens per completion")
    parser.add_argument("--image", default=IMAGE)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))

    t = time.perf_counter()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    params = sum(p.numel() for p in model.parameters())
    say(f"policy: random Qwen2, {params:,} parameters, {len(tokenizer)} tokens (built locally)")

    GROUPS = Groups(args.image, args.group, args.prefix, args.warm)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]} for i in range(64)]
    )
    with tempfile.TemporaryDirectory(prefix="denv-trl-") as out:
        config = GRPOConfig(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.group * args.prompts,
            num_generations=args.group,
            max_completion_length=args.max_completion,
            max_tool_calling_iterations=1,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,
            seed=0,
            disable_tqdm=True,
        )
        report = StepReport(GROUPS)
        try:
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=env_reward,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                environment_factory=EchoRollout,
                callbacks=[report],
            )
            trainer.remove_callback(PrinterCallback)  # StepReport prints one line a step
            say(f"set-up {time.perf_counter() - t:.1f}s; training {args.steps} steps ...")
            trainer.train()
        finally:
            for rollout in LIVE:
                rollout._close()
            GROUPS.close()
    say(f"done in {time.perf_counter() - t:.1f}s; every env it started is deleted")
    return 0 if len(report.lines) == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
