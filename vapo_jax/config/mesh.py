"""config.mesh: the device mesh, the train passes' own mesh and the sharding rules
(`run.meshes`; `sharding`)."""

import dataclasses

from vapo_jax.config.base import need


@dataclasses.dataclass(frozen=True)
class MeshSection:
  data: int = 1
  fsdp: int = -1
  tensor: int = 1
  rules: tuple = ()                     # () = vapo_jax.sharding.DEFAULT_RULES
  # The train passes' layout on the same devices (the rollout engine always decodes from
  # `rules`, tensor-parallel replicas): "shared": `rules` too; "fsdp": FSDP over every
  # chip (`sharding.fsdp_only(rules)`: rows and the embed dim over data x fsdp x tensor, no
  # activation all-reduces). The engine's decode copy is resharded from it once per step.
  train_layout: str = "shared"
  # The train passes' own mesh: 0 = they share the decode mesh (data, fsdp, tensor) above.
  # t >= 1 (other than the resolved `tensor`) lays the same devices, in the same flat order,
  # out as a second mesh (data, N / (data t), t) with the same axis names, and the learners
  # (parameters, optimizer states, the log-prob, value and update passes) live and run on it
  # under their rules (`train_layout`) while the engines keep the decode mesh (a smaller t:
  # fewer and smaller tensor-parallel activation all-reduces, FSDP over more chips). The
  # rollout batch moves to it, and the engine's decode copy is resharded from it, once per
  # rollout (`run.meshes.build_train_mesh`). data x t must divide the devices.
  train_tensor: int = 0

  def check(self) -> None:
    sizes = (self.data, self.fsdp, self.tensor)
    need(all(x == -1 or x >= 1 for x in sizes) and sizes.count(-1) <= 1, "mesh", sizes,
         "sizes >= 1 with at most one -1 (data, fsdp, tensor)")
    need(self.train_layout in ("shared", "fsdp"), "mesh.train_layout", self.train_layout,
         '"shared" (the train passes use mesh.rules) or "fsdp" (FSDP over every chip)')
    need(isinstance(self.train_tensor, int) and self.train_tensor >= 0, "mesh.train_tensor",
         self.train_tensor, "0 (the decode mesh) or the train mesh's tensor size >= 1")
    for rule in self.rules:
      need(isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str),
           "mesh.rules", rule, "(logical name, mesh axes) pairs")
