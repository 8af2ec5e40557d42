# %% [markdown]
# # FedAvg vs. your own algorithm, from Python
#
# A notebook in script form (`# %%` cells: run it in VS Code / Jupyter, or `python
# examples/notebook_custom_algorithm.py`). It runs FedAvg and FedAvgM — a server-momentum variant
# written outside fedray, in `examples/plugins/mylab/fedavgm.py` — on the embedded digits data with
# label skew, and plots the two learning curves. See docs/writing_an_algorithm.md.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

import fedray

# The user's own package `mylab/` sits in examples/plugins/. In a notebook started in that directory
# this line is not needed: fedray also looks in the current directory. Ray's workers need nothing:
# fedray ships the module to them. Jupyter defines no __file__: there, this file's directory is the
# notebook's working directory.
here = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(here / "plugins"))

# %% One base config; the two runs differ only in the algorithm.
base = {
    "data": {"name": "digits", "num_clients": 20, "alpha": 0.3},
    "train": {"rounds": 20, "clients_per_round": 10, "local_epochs": 1, "lr": 0.05},
    "output": {"dir": "runs/notebook", "tensorboard": False},
}
algorithms = {
    "FedAvg": {"name": "fedavg"},
    "FedAvgM (β = 0.5)": {"name": "mylab.fedavgm:FedAvgM", "server_momentum": 0.5},
}

# %% Run both (each call starts its server and worker actors on the same local Ray).
curves = {}
for label, algorithm in algorithms.items():
    config = fedray.build_config({**base, "algorithm": algorithm})
    summary = fedray.run_experiment(config, progress=False)
    curves[label] = pd.DataFrame(fedray.read_metrics(summary.run_dir)).set_index("round")["test_accuracy"]
    print(f"{label:20s} final accuracy {summary.final_test_accuracy:.4f}  ({summary.run_dir})")

# %% Plot the two learning curves.
fig, ax = plt.subplots(figsize=(6, 4))
for label, accuracy in curves.items():
    ax.plot(accuracy.index, accuracy.values, label=label)
ax.set(xlabel="round", ylabel="test accuracy", title="digits, Dirichlet α = 0.3, 20 clients")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig("runs/notebook/fedavg_vs_fedavgm.png", dpi=100)
print("plot: runs/notebook/fedavg_vs_fedavgm.png")
