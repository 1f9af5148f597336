//! A loaded component of any policy world: what it said about itself, and a pre-linked instance
//! of its world's bindings. One generic [`Loaded`] serves every world; the public handles
//! ([`RouterComponent`], [`AdmissionComponent`], [`KvHintsComponent`]) keep the worlds apart in
//! the type system so a runner cannot be built over the wrong one.

use crate::bindings::{self, PolicyMetadata, RouterPre};
use crate::bindings::{admission, kv_hints};
use crate::engine::{ContentHash, HostState, PolicyEngine, WIT_MAJOR};
use crate::error::PolicyError;
use std::fmt;
use std::sync::Arc;
use wasmtime::Store;
use wasmtime::component::InstancePre;

/// One world's generated bindings, as the host needs them: implemented by each world's
/// instance type (`bindings::Router`, ...).
pub(crate) trait World: Sized + 'static {
    /// `world-name` a component of this world reports, and the world's name in `wit/`.
    const NAME: &'static str;
    /// The pre-linked, export-checked instance of this world.
    type Pre: Clone + Send + Sync + 'static;

    /// Check the component's exports against this world's types.
    fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre>;
    /// A new instance in `store`.
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self>;
    /// Call the world's `metadata` export.
    fn metadata(&self, store: &mut Store<HostState>) -> wasmtime::Result<PolicyMetadata>;
}

/// Implement [`World`] for a generated world: every world has the same three entry points,
/// only the generated names differ.
macro_rules! world {
    ($instance:ty, $pre:ty, $name:literal) => {
        impl World for $instance {
            const NAME: &'static str = $name;
            type Pre = $pre;

            fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre> {
                <$pre>::new(pre)
            }

            fn instantiate(
                pre: &Self::Pre,
                store: &mut Store<HostState>,
            ) -> wasmtime::Result<Self> {
                pre.instantiate(store)
            }

            fn metadata(&self, store: &mut Store<HostState>) -> wasmtime::Result<PolicyMetadata> {
                self.call_metadata(store)
            }
        }
    };
}

world!(bindings::Router, RouterPre<HostState>, "router");
world!(
    admission::Admission,
    admission::AdmissionPre<HostState>,
    "admission"
);
world!(
    kv_hints::KvHints,
    kv_hints::KvHintsPre<HostState>,
    "kv-hints"
);

/// What a component said about itself at load.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Metadata {
    /// The policy's name (`kv-cost`).
    pub name: String,
    /// Its own version.
    pub version: String,
    /// The world it implements (`router`, `admission`, `kv-hints`).
    pub world: String,
    /// The `switchyard:policy` version it was built against.
    pub wit_version: String,
    /// One line for humans.
    pub description: String,
}

impl Metadata {
    fn check(raw: PolicyMetadata, world: &str) -> Result<Self, PolicyError> {
        if raw.world_name != world {
            return Err(PolicyError::WrongWorld(format!(
                "metadata says world `{}`, expected `{world}`",
                raw.world_name
            )));
        }
        let major = raw
            .wit_version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u64>().ok());
        if major != Some(WIT_MAJOR) {
            return Err(PolicyError::IncompatibleVersion(format!(
                "built against switchyard:policy@{}, this host implements {WIT_MAJOR}.x",
                raw.wit_version
            )));
        }
        if raw.name.is_empty() {
            return Err(PolicyError::BadOutput("metadata has an empty name".into()));
        }
        Ok(Self {
            name: raw.name,
            version: raw.version,
            world: raw.world_name,
            wit_version: raw.wit_version,
            description: raw.description,
        })
    }
}

/// A compiled, pre-linked component of world `W` whose metadata passed the checks.
pub(crate) struct Loaded<W: World> {
    engine: PolicyEngine,
    pre: W::Pre,
    metadata: Metadata,
    hash: ContentHash,
}

impl<W: World> Loaded<W> {
    /// Read and check the metadata of a freshly linked component.
    pub(crate) fn new(
        engine: PolicyEngine,
        pre: W::Pre,
        hash: ContentHash,
    ) -> Result<Self, PolicyError> {
        let mut loaded = Self {
            engine,
            pre,
            metadata: Metadata::default(),
            hash,
        };
        // Instantiation and this first call run under the startup deadline.
        let (mut store, instance) = loaded.instantiate(true)?;
        let raw = instance
            .metadata(&mut store)
            .map_err(|e| PolicyError::from_call(&e, store.data()))?;
        loaded.metadata = Metadata::check(raw, W::NAME)?;
        Ok(loaded)
    }

    pub(crate) fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub(crate) fn engine(&self) -> &PolicyEngine {
        &self.engine
    }

    /// A fresh instance in a fresh store; `startup`: under the startup deadline (see
    /// [`PolicyEngine::new_store`]).
    pub(crate) fn instantiate(&self, startup: bool) -> Result<(Store<HostState>, W), PolicyError> {
        let name = Some(self.metadata.name.as_str()).filter(|n| !n.is_empty());
        let mut store = self.engine.new_store(name, startup);
        match W::instantiate(&self.pre, &mut store) {
            Ok(instance) => Ok((store, instance)),
            Err(e) => Err(PolicyError::from_call(&e, store.data())),
        }
    }
}

/// A public handle on a [`Loaded`] component of one world.
pub(crate) trait ComponentHandle: Clone + fmt::Debug + Send + 'static {
    /// The world's bindings.
    type World: World;
    /// The loaded component.
    fn loaded(&self) -> &Loaded<Self::World>;
}

/// Define a public, cheap-to-clone handle on a loaded component of one world.
macro_rules! handle {
    ($(#[$doc:meta])* $handle:ident, $world:ty) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $handle(Arc<Loaded<$world>>);

        impl $handle {
            pub(crate) fn new(loaded: Loaded<$world>) -> Self {
                Self(Arc::new(loaded))
            }

            /// What the component said about itself.
            pub fn metadata(&self) -> &Metadata {
                &self.0.metadata
            }

            /// Hash of the bytes it was compiled from.
            pub fn hash(&self) -> ContentHash {
                self.0.hash
            }
        }

        impl ComponentHandle for $handle {
            type World = $world;
            fn loaded(&self) -> &Loaded<$world> {
                &self.0
            }
        }

        impl fmt::Debug for $handle {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($handle))
                    .field("metadata", &self.0.metadata)
                    .field("hash", &self.0.hash)
                    .finish_non_exhaustive()
            }
        }
    };
}

handle!(
    /// A checked `router` component: instantiating it is cheap. Cheap to clone.
    RouterComponent,
    bindings::Router
);
handle!(
    /// A checked `admission` component: instantiating it is cheap. Cheap to clone.
    AdmissionComponent,
    admission::Admission
);
handle!(
    /// A checked `kv-hints` component: instantiating it is cheap. Cheap to clone.
    KvHintsComponent,
    kv_hints::KvHints
);
