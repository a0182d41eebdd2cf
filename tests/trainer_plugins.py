"""A reward plug-in for trainer tests: about half of random responses score 1."""


def even_digits(prompt, response, reference):
  del prompt, reference
  return float(sum(c.isdigit() for c in response) % 2 == 0)


def problem_parity(prompt, response, reference):
  """Correct for some problems, wrong for the others, whatever the response: an evaluation's
  expected scores follow from its examples alone."""
  del response, reference
  return float(sum(map(ord, prompt)) % 2 == 0)
