//! The read planner of dynamic replica retrieval (paper 4 §3.3): which copy of each block of
//! a read to fetch, under a device model. Pure: it reads the model and the candidates and
//! changes nothing, so the engine ([`super::Replicas`]) and the lab's timed trace replay
//! (`onecopy_lab::paper4`) run the same code over their own models.
//!
//! Terms:
//! - *position*: where a copy lies in the device's address space (bytes for the engine, 512-byte
//!   sectors for the lab's disk); the model decides what a distance costs.
//! - *candidate*: one copy of a block's content; candidate 0 is always the block's own copy,
//!   the one a system without replica retrieval reads.
//! - *head*: where the device is after the previous read of the plan (for a disk, the position
//!   after the last byte transferred).
//!
//! A run of blocks read together is planned greedily, block by block, each from the head the
//! previous choice left, and the greedy plan is kept only when the model costs it below
//! reading every block in place: a copy that is nearer for the first block but leaves the head
//! far from the rest is not taken. Ties keep the block's own copy.

/// What reading from a position costs, for the planner.
pub trait DeviceModel {
    /// The device's state between two reads of one plan: where the head is, and for models
    /// that track it, when.
    type Head: Copy;

    /// The head before the plan's first read.
    fn head(&self) -> Self::Head;

    /// What reading `length` units at `position` costs from `head` (in the model's unit,
    /// nanoseconds or a distance), and the head after that read.
    fn read(&self, head: Self::Head, position: u64, length: u64) -> (u64, Self::Head);
}

/// One block of a run: its candidates' positions, the block's own copy first, and the length
/// of one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockCandidates {
    pub positions: Vec<u64>,
    pub length: u64,
}

impl BlockCandidates {
    /// A block with only its own copy.
    pub fn own(position: u64, length: u64) -> BlockCandidates {
        BlockCandidates {
            positions: vec![position],
            length,
        }
    }
}

/// The plan of a run: the candidate chosen for each block, and the model's cost of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub choices: Vec<usize>,
    pub cost: u64,
}

/// Plans a run of blocks read together (see the module documentation).
pub fn plan_run<M: DeviceModel>(model: &M, blocks: &[BlockCandidates]) -> Plan {
    assert!(
        blocks.iter().all(|block| !block.positions.is_empty()),
        "every block has its own copy"
    );
    let in_place = cost_of(model, blocks, |_| 0);
    if blocks.iter().all(|block| block.positions.len() == 1) {
        return Plan {
            choices: vec![0; blocks.len()],
            cost: in_place,
        };
    }
    let mut head = model.head();
    let mut choices = Vec::with_capacity(blocks.len());
    let mut greedy = 0u64;
    for block in blocks {
        let (index, (cost, next)) = block
            .positions
            .iter()
            .map(|&position| model.read(head, position, block.length))
            .enumerate()
            // `min_by_key` keeps the first of equal costs: the block's own copy wins ties.
            .min_by_key(|(_, (cost, _))| *cost)
            .expect("every block has a candidate");
        choices.push(index);
        greedy = greedy.saturating_add(cost);
        head = next;
    }
    if greedy < in_place {
        Plan {
            choices,
            cost: greedy,
        }
    } else {
        Plan {
            choices: vec![0; blocks.len()],
            cost: in_place,
        }
    }
}

/// The cost of reading each block from the candidate `choose` names.
fn cost_of<M: DeviceModel>(
    model: &M,
    blocks: &[BlockCandidates],
    choose: impl Fn(usize) -> usize,
) -> u64 {
    let mut head = model.head();
    let mut total = 0u64;
    for (index, block) in blocks.iter().enumerate() {
        let (cost, next) = model.read(head, block.positions[choose(index)], block.length);
        total = total.saturating_add(cost);
        head = next;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head that costs the distance it travels.
    struct Distance(u64);

    impl DeviceModel for Distance {
        type Head = u64;
        fn head(&self) -> u64 {
            self.0
        }
        fn read(&self, head: u64, position: u64, length: u64) -> (u64, u64) {
            (head.abs_diff(position), position + length)
        }
    }

    /// Goal: the nearest copy is read, ties keep the own copy, and a run follows a copy that
    /// holds it whole but is read in place when a copy would only pull the head away. Method:
    /// distance costs on hand-placed copies.
    #[test]
    fn nearest_copies_and_runs() {
        let model = Distance(1000);
        let single = [BlockCandidates {
            positions: vec![0, 990, 1010],
            length: 1,
        }];
        assert_eq!(plan_run(&model, &single).choices, vec![1]);
        let tie = [BlockCandidates {
            positions: vec![1000, 1000],
            length: 1,
        }];
        assert_eq!(plan_run(&model, &tie).choices, vec![0]);
        // A run of three blocks at 0..3, copied whole at 1000..1003: read at the copy.
        let whole: Vec<BlockCandidates> = (0..3)
            .map(|block| BlockCandidates {
                positions: vec![block, 1000 + block],
                length: 1,
            })
            .collect();
        assert_eq!(plan_run(&model, &whole).choices, vec![1, 1, 1]);
        assert_eq!(plan_run(&model, &whole).cost, 0);
        // Only the first block has a copy near the head: going there and coming back costs
        // more than reading the run in place.
        let model = Distance(600);
        let partial = vec![
            BlockCandidates {
                positions: vec![0, 900],
                length: 1,
            },
            BlockCandidates::own(1, 1),
            BlockCandidates::own(2, 1),
        ];
        let plan = plan_run(&model, &partial);
        assert_eq!(plan.choices, vec![0, 0, 0]);
        assert_eq!(plan.cost, 600);
    }
}
