"""File names of a run directory and of a sweep directory: the on-disk contract that the runtime,
``fedray tune``, the dashboard and notebooks share (docs/tune.md, "The sweep directory").

Plain constants, no imports: the dashboard reads these folders without loading torch or Ray.
"""

# A run directory (written by ``fedray run``, and by each trial of a sweep).
SAVED_CONFIG_FILE = "config.yaml"  # the validated config the run started with
SUMMARY_FILE = "summary.json"  # written when the run finishes
PARTITION_PLOT = "partition.png"
LEARNING_CURVE_PLOT = "learning_curve.png"

# A sweep directory (written by ``fedray tune``).
SWEEP_FILE = "sweep.yaml"  # the sweep spec, as given
META_FILE = "meta.json"  # the sweep's description and status
TRIALS_FILE = "trials.parquet"  # one row per trial
ROUNDS_FILE = "rounds.parquet"  # one row per trial per reported round
TRIALS_DIR = "trials"  # trials/<trial_id>/ is each trial's run directory

# Trial statuses in trials.parquet.
PENDING, RUNNING, TERMINATED, ERROR, STOPPED_EARLY = "PENDING", "RUNNING", "TERMINATED", "ERROR", "STOPPED_EARLY"
