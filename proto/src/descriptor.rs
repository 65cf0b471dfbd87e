use std::sync::OnceLock;

use prost::Message as _;
use prost_reflect::DescriptorPool;
use prost_types::FileDescriptorSet;

use crate::{Error, Result};

/// The compiled descriptor set of every `.proto` file, as the build produced
/// it. `nisse replay` uses it to print any message as JSON.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/nisse_descriptor.binpb"));

/// The released shape of the contracts, committed as
/// `proto/descriptor.snapshot.binpb`. The current contracts must stay wire
/// compatible with it ([`crate::compat::check`]).
pub fn released_descriptor_set() -> Result<FileDescriptorSet> {
    FileDescriptorSet::decode(&include_bytes!("../descriptor.snapshot.binpb")[..])
        .map_err(|e| Error::Descriptor(e.to_string()))
}

/// The reflection pool over [`FILE_DESCRIPTOR_SET`], built once.
pub fn descriptor_pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        #[expect(
            clippy::expect_used,
            reason = "the set is produced by this crate's own build from files protox already resolved"
        )]
        DescriptorPool::decode(FILE_DESCRIPTOR_SET).expect("the embedded descriptor set resolves")
    })
}
