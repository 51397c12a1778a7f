"""Process layouts of a run, beneath the run pipeline (``privzo.run``), which dispatches to them.

``layout`` names the layouts and answers a rank's questions (evaluates, reports, which hooks
run, how weights are saved); ``context`` is what every layout trains on and how it is built
(zero3 passes its partitioned model loader); ``train`` is the one ``train_and_evaluate`` of a
single process and of every Ray Train rank; ``record`` is the run's files and typed summary,
``resume`` the resume point of any run and a single run's progress in its directory. The Ray
Train parts (launcher, worker, checkpoints across launches, ZeRO-3 loading) live in
``privzo.distributed``, at this same layer.
"""
