"""A batch loop inside an epoch loop; a DistributedSampler(drop_last=False) deals the
samples and a collate that filters corrupt ones returns None for an all-corrupt batch,
which the loop skips with `continue`. Rank 1 gets that batch: one DDP step fewer per
epoch, seen only when it leaves the epochs and the others are still in their batches.
2 ranks."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Toy(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((8,), float(i)), i not in (13, 15)  # both dealt to rank 1


def collate(items):
    good = [x for x, ok in items if ok]
    return torch.stack(good) if good else None


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = Toy()
    sampler = DistributedSampler(ds, world, rank, shuffle=False, drop_last=False)
    loader = DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=collate)
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for batch in loader:
            if batch is None:  # expect: branch
                continue  # expect: skip
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
