//! The lab: workloads, trace replay, experiments that reproduce the papers, plots. (in progress)
