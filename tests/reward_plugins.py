"""Reward plug-ins used by the scorer tests (imported by name in workers)."""

import os
import signal
import time


def always_one(prompt, response, reference):
  del prompt, response, reference
  return 1.0


def exact_match(prompt, response, reference):
  del prompt
  return response.strip() == reference.strip()


def with_reason(prompt, response, reference):
  del prompt, reference
  return 0.5, f"len={len(response)}"


def sleepy(prompt, response, reference):
  """Hangs on 'hang', crashes on 'crash', raises on 'raise', else 1."""
  del prompt, reference
  if response == "hang":
    while True:
      time.sleep(0.01)
  if response == "spin":
    while True:
      pass
  if response == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
  if response == "raise":
    raise ValueError("bad")
  return 1.0


def bad_type(prompt, response, reference):
  del prompt, response, reference
  return "yes"


def prompt_aware(prompt, response, reference):
  """Scores by prompt to check the order of results."""
  del response, reference
  return float(int(prompt))
