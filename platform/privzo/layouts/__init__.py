"""Process layouts of a run, beneath the run pipeline (``privzo.run``), which dispatches to them.

``layout`` names the layouts and answers a rank's questions (evaluates, reports, which hooks
run, how weights are saved); ``context`` is what every layout trains on and how it is built
(zero3 passes its partitioned model loader); ``train`` is the one ``train_and_evaluate`` of a
single process and of every Ray Train rank; ``config`` is the ``parallel`` section, whose
``strategy`` names the layout. The machinery the multi-process layouts run on (Ray Train's
launcher and worker, the all-reduce, checkpoints across launches, ZeRO-3 loading) lives in
``privzo.distributed``, at this same layer; the run's files are ``privzo.rundir``'s.
"""
