"""PyTorch 1.13 (Debian python3-torch) reference for train_mlp.lua's accuracy: the same MLP
784-512-256-10, Adam lr 1e-3, batch 128, Fashion-MNIST /255, test accuracy after each of 5
epochs, for the seeds given on the command line:

    /usr/bin/python3 scripts/bench/mlp_accuracy_torch.py 0 1 2 3

Compare with: build/mpengine scripts/train_mlp.lua --epochs 5 --seed S
"""
import gzip, numpy as np, torch, sys
D="/usr/share/datasets/fashion-mnist"
def load(p, off): 
    with gzip.open(f"{D}/{p}") as f: return np.frombuffer(f.read(), np.uint8, offset=off)
xtr=torch.from_numpy(load("train-images-idx3-ubyte.gz",16).reshape(-1,784).astype(np.float32)/255)
ytr=torch.from_numpy(load("train-labels-idx1-ubyte.gz",8).astype(np.int64))
xte=torch.from_numpy(load("t10k-images-idx3-ubyte.gz",16).reshape(-1,784).astype(np.float32)/255)
yte=torch.from_numpy(load("t10k-labels-idx1-ubyte.gz",8).astype(np.int64))
for seed in [int(a) for a in sys.argv[1:]] or [0]:
    torch.manual_seed(seed)
    m=torch.nn.Sequential(torch.nn.Linear(784,512),torch.nn.ReLU(),torch.nn.Linear(512,256),torch.nn.ReLU(),torch.nn.Linear(256,10))
    opt=torch.optim.Adam(m.parameters(),lr=1e-3)
    accs=[]
    for ep in range(5):
        perm=torch.randperm(60000)
        for i in range(0,60000,128):
            idx=perm[i:i+128]
            opt.zero_grad(); loss=torch.nn.functional.cross_entropy(m(xtr[idx]),ytr[idx]); loss.backward(); opt.step()
        with torch.no_grad(): accs.append((m(xte).argmax(1)==yte).float().mean().item())
    print(seed, " ".join(f"{a:.4f}" for a in accs), flush=True)
