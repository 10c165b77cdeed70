//! The shape of a job graph as the cluster compares it: stages (uid, parallelism, inputs, outputs),
//! edges (from, to, kind) and the maximum parallelism. The coordinator sends its graph's shape with
//! the job; a worker that built another shape from the same arguments (another binary, or a builder
//! that reads its own configuration) refuses the job with the first difference named, instead of
//! deploying tasks that do not fit the coordinator's placement.
//!
//! It does not compare what operators do (a fingerprint of the job does that, as far as it can).

use crate::dataflow::JobGraph;
use serde::{Deserialize, Serialize};

/// One stage of a [`GraphShape`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct StageShape {
    pub uid: String,
    pub parallelism: u32,
    /// Edge indices.
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
}

/// One edge of a [`GraphShape`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct EdgeShape {
    pub from: u32,
    pub to: u32,
    /// `Forward`, `Hash`, `Rebalance` or `Broadcast`.
    pub kind: String,
}

/// What of a job graph every process of a cluster must agree on.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct GraphShape {
    pub max_parallelism: u32,
    pub stages: Vec<StageShape>,
    pub edges: Vec<EdgeShape>,
}

impl GraphShape {
    pub(crate) fn of(graph: &JobGraph) -> GraphShape {
        GraphShape {
            max_parallelism: graph.max_parallelism,
            stages: graph
                .stages
                .iter()
                .map(|s| StageShape {
                    uid: s.uid.clone(),
                    parallelism: s.parallelism,
                    inputs: s.inputs.iter().map(|&e| e as u32).collect(),
                    outputs: s.outputs.iter().map(|&e| e as u32).collect(),
                })
                .collect(),
            edges: graph
                .edges
                .iter()
                .map(|e| EdgeShape { from: e.from as u32, to: e.to as u32, kind: format!("{:?}", e.kind) })
                .collect(),
        }
    }

    /// The first difference between `self` (here) and `there` (the coordinator's), in words; `None`
    /// if they are the same.
    pub(crate) fn difference(&self, there: &GraphShape) -> Option<String> {
        if self.max_parallelism != there.max_parallelism {
            return Some(format!(
                "the maximum parallelism is {} here and {} at the coordinator",
                self.max_parallelism, there.max_parallelism
            ));
        }
        if self.stages.len() != there.stages.len() {
            return Some(format!(
                "the job has {} stages here and {} at the coordinator",
                self.stages.len(),
                there.stages.len()
            ));
        }
        for (i, (a, b)) in self.stages.iter().zip(&there.stages).enumerate() {
            if a.uid != b.uid {
                return Some(format!("stage {i} is {:?} here and {:?} at the coordinator", a.uid, b.uid));
            }
            if a.parallelism != b.parallelism {
                return Some(format!(
                    "stage {:?} has parallelism {} here and {} at the coordinator",
                    a.uid, a.parallelism, b.parallelism
                ));
            }
            if a.inputs != b.inputs || a.outputs != b.outputs {
                return Some(format!("stage {:?} is connected differently here and at the coordinator", a.uid));
            }
        }
        let name = |shape: &GraphShape, s: u32| {
            shape.stages.get(s as usize).map(|s| s.uid.clone()).unwrap_or_else(|| format!("#{s}"))
        };
        for (a, b) in self.edges.iter().zip(&there.edges) {
            if a != b {
                return Some(format!(
                    "edge {} -> {} is {} here, the coordinator's edge {} -> {} is {}",
                    name(self, a.from),
                    name(self, a.to),
                    a.kind,
                    name(there, b.from),
                    name(there, b.to),
                    b.kind
                ));
            }
        }
        if self.edges.len() != there.edges.len() {
            return Some(format!(
                "the job has {} edges here and {} at the coordinator",
                self.edges.len(),
                there.edges.len()
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(parallelism: &[u32], kinds: &[&str]) -> GraphShape {
        GraphShape {
            max_parallelism: 128,
            stages: parallelism
                .iter()
                .enumerate()
                .map(|(i, &p)| StageShape {
                    uid: format!("s{i}"),
                    parallelism: p,
                    inputs: if i == 0 { vec![] } else { vec![i as u32 - 1] },
                    outputs: (i + 1 < parallelism.len()).then_some(i as u32).into_iter().collect(),
                })
                .collect(),
            edges: kinds
                .iter()
                .enumerate()
                .map(|(i, k)| EdgeShape { from: i as u32, to: i as u32 + 1, kind: k.to_string() })
                .collect(),
        }
    }

    #[test]
    fn every_kind_of_difference_is_named() {
        let here = shape(&[2, 2], &["Hash"]);
        assert_eq!(here.difference(&here.clone()), None);
        let d = here.difference(&shape(&[2, 3], &["Hash"])).unwrap();
        assert_eq!(d, "stage \"s1\" has parallelism 2 here and 3 at the coordinator");
        let d = here.difference(&shape(&[2, 2], &["Forward"])).unwrap();
        assert!(d.contains("s0 -> s1 is Hash here") && d.contains("is Forward"), "{d}");
        let d = here.difference(&shape(&[2, 2, 2], &["Hash", "Hash"])).unwrap();
        assert!(d.contains("2 stages here and 3"), "{d}");
        let mut other = here.clone();
        other.stages[1].inputs.clear();
        let d = here.difference(&other).unwrap();
        assert!(d.contains("stage \"s1\" is connected differently"), "{d}");
        let d = shape(&[2], &[]).difference(&shape(&[2, 2], &["Hash"])).unwrap();
        assert!(d.contains("1 stages here and 2"), "{d}");
        other = here.clone();
        other.max_parallelism = 64;
        assert!(here.difference(&other).unwrap().contains("maximum parallelism is 128 here and 64"));
        other = here.clone();
        other.stages[0].uid = "lines".into();
        assert!(here.difference(&other).unwrap().contains("\"s0\" here and \"lines\""));
    }

    #[test]
    fn a_real_graph_has_its_stages_edges_and_parallelism_in_its_shape() {
        use crate::connectors::{DiscardSink, GeneratorSource};
        let graph = |p: u32| {
            let job = crate::dataflow::Job::new("shape");
            job.source_with_parallelism("numbers", 1, GeneratorSource::new(10, |i| i))
                .key_by(|k: &u64| *k)
                .parallelism(p)
                .aggregate("counts", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
                .sink("out", DiscardSink);
            job.build().unwrap()
        };
        let (a, b) = (GraphShape::of(&graph(2)), GraphShape::of(&graph(3)));
        assert_eq!(a, GraphShape::of(&graph(2)));
        assert!(a.stages.len() >= 2 && !a.edges.is_empty(), "{a:?}");
        let d = a.difference(&b).expect("another parallelism is another shape");
        assert!(d.contains("parallelism 2 here and 3 at the coordinator"), "{d}");
    }
}
