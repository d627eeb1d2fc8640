"""Names a rank's own code gives (a group's description, a span) that hold rich markup and
terminal escape codes: `distdoctor show` and `diagnose` print them as the text they are."""

import torch
import torch.distributed as dist

import distdoctor

dist.init_process_group("gloo")
group = dist.new_group([0, 1], group_desc="[/x] mesh \x1b[2J[bold]tp")
t = torch.ones(4)
for _ in range(3):
    with distdoctor.trace("[/y] step \x1b]0;owned\x07"):
        dist.all_reduce(t, group=group)
dist.destroy_process_group()
