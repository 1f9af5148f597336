//! A loaded component of any policy world: what it said about itself, and a pre-linked instance
//! of its world's bindings. One generic [`Loaded`] serves every world; the public handles
//! ([`RouterComponent`], [`AdmissionComponent`], [`KvHintsComponent`]) keep the worlds apart in
//! the type system so a runner cannot be built over the wrong one.

use crate::bindings::configurable::{Configurable, ConfigurableIndices};
use crate::bindings::{self, PolicyMetadata};
use crate::bindings::{
    admission, admission_packed, admission_placement, kv_hints, kv_hints_outcomes, router_arrival,
    router_packed,
};
use crate::engine::{ContentHash, HostState, PolicyEngine, WIT_MAJOR};
use crate::error::PolicyError;
use std::fmt;
use std::sync::Arc;
use wasmtime::Store;
use wasmtime::component::InstancePre;

/// One world's bindings, as the host needs them: the frozen 1.0 core every component of the
/// world exports, and the 1.1 additions it may export (the host dispatches on what is there).
pub(crate) trait World: Sized + 'static {
    /// `world-name` a component of this world reports, and the world's name in `wit/`.
    const NAME: &'static str;
    /// The pre-linked, export-checked instance of this world.
    type Pre: Clone + Send + Sync + 'static;

    /// Check the component's exports against this world's types (the 1.1 ones only if it
    /// exports them).
    fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre>;
    /// A new instance in `store`.
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self>;
    /// Call the world's `metadata` export.
    fn metadata(&self, store: &mut Store<HostState>) -> wasmtime::Result<PolicyMetadata>;
    /// The 1.1 `configure` export, if the component has it.
    fn configurable(&self) -> Option<&Configurable>;
    /// Whether the component exports 1.1's `configure`.
    fn pre_configurable(pre: &Self::Pre) -> bool;
    /// Whether the component exports the world's own 1.1 function (`queue-key-at`,
    /// `placement`, `on-outcomes`).
    fn pre_extended(pre: &Self::Pre) -> bool;
}

/// The indices of an optional export set: `None` when the component lacks `export`, an error
/// when it has it with the wrong type.
fn optional<I>(
    pre: &InstancePre<HostState>,
    export: &str,
    indices: impl FnOnce(&InstancePre<HostState>) -> wasmtime::Result<I>,
) -> wasmtime::Result<Option<I>> {
    match pre.component().get_export_index(None, export) {
        Some(_) => indices(pre).map(Some),
        None => Ok(None),
    }
}

/// Define a world's instance and pre-linked types: its generated 1.0 core, `configure`, the
/// world's own 1.1 export set (`$extra`, loaded when the component exports `$export`), and any
/// later ones (`$later`, since version `$since`).
macro_rules! world {
    (
        $(#[$doc:meta])* $instance:ident, $pre:ident, $name:literal,
        core: $core:ty, $core_indices:ty,
        $extra:ident: $extra_ty:ty, $extra_indices:ty, $export:literal
        $(, $later:ident: $later_ty:ty, $later_indices:ty, $later_export:literal, $since:literal)*
    ) => {
        $(#[$doc])*
        pub(crate) struct $instance {
            /// The 1.0 exports.
            pub(crate) core: $core,
            /// 1.1 `configure`, if exported.
            pub(crate) configure: Option<Configurable>,
            #[doc = concat!("1.1 `", $export, "`, if exported.")]
            pub(crate) $extra: Option<$extra_ty>,
            $(
                #[doc = concat!($since, " `", $later_export, "`, if exported.")]
                pub(crate) $later: Option<$later_ty>,
            )*
        }

        #[doc = concat!("[`", stringify!($instance), "`], pre-linked.")]
        #[derive(Clone)]
        pub(crate) struct $pre {
            instance_pre: InstancePre<HostState>,
            core: $core_indices,
            configure: Option<ConfigurableIndices>,
            $extra: Option<$extra_indices>,
            $($later: Option<$later_indices>,)*
        }

        impl World for $instance {
            const NAME: &'static str = $name;
            type Pre = $pre;

            fn pre(pre: InstancePre<HostState>) -> wasmtime::Result<Self::Pre> {
                Ok($pre {
                    core: <$core_indices>::new(&pre)?,
                    configure: optional(&pre, "configure", ConfigurableIndices::new)?,
                    $extra: optional(&pre, $export, <$extra_indices>::new)?,
                    $($later: optional(&pre, $later_export, <$later_indices>::new)?,)*
                    instance_pre: pre,
                })
            }

            fn instantiate(
                pre: &Self::Pre,
                store: &mut Store<HostState>,
            ) -> wasmtime::Result<Self> {
                let instance = pre.instance_pre.instantiate(&mut *store)?;
                Ok(Self {
                    core: pre.core.load(&mut *store, &instance)?,
                    configure: pre
                        .configure
                        .as_ref()
                        .map(|i| i.load(&mut *store, &instance))
                        .transpose()?,
                    $extra: pre
                        .$extra
                        .as_ref()
                        .map(|i| i.load(&mut *store, &instance))
                        .transpose()?,
                    $(
                        $later: pre
                            .$later
                            .as_ref()
                            .map(|i| i.load(&mut *store, &instance))
                            .transpose()?,
                    )*
                })
            }

            fn metadata(&self, store: &mut Store<HostState>) -> wasmtime::Result<PolicyMetadata> {
                self.core.call_metadata(store)
            }

            fn configurable(&self) -> Option<&Configurable> {
                self.configure.as_ref()
            }

            fn pre_configurable(pre: &Self::Pre) -> bool {
                pre.configure.is_some()
            }

            fn pre_extended(pre: &Self::Pre) -> bool {
                pre.$extra.is_some()
            }
        }
    };
}

world!(
    /// A live `router` component.
    RouterInstance, RouterInstancePre, "router",
    core: bindings::RouterCore, bindings::RouterCoreIndices,
    arrival: router_arrival::RouterArrival, router_arrival::RouterArrivalIndices, "queue-key-at",
    packed: router_packed::RouterPacked, router_packed::RouterPackedIndices, "route-packed", "1.2"
);
world!(
    /// A live `admission` component.
    AdmissionInstance, AdmissionInstancePre, "admission",
    core: admission::AdmissionCore, admission::AdmissionCoreIndices,
    placement: admission_placement::AdmissionPlacement,
        admission_placement::AdmissionPlacementIndices, "placement",
    packed: admission_packed::AdmissionPacked, admission_packed::AdmissionPackedIndices,
        "arrival-packed", "1.3"
);
world!(
    /// A live `kv-hints` component.
    KvHintsInstance, KvHintsInstancePre, "kv-hints",
    core: kv_hints::KvHintsCore, kv_hints::KvHintsCoreIndices,
    outcomes: kv_hints_outcomes::KvHintsOutcomes,
        kv_hints_outcomes::KvHintsOutcomesIndices, "on-outcomes"
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

    pub(crate) fn pre(&self) -> &W::Pre {
        &self.pre
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

            /// Whether it takes parameters: it exports 1.1's `configure` (a 1.0 component
            /// does not, and refuses any).
            pub fn configurable(&self) -> bool {
                <$world as World>::pre_configurable(self.0.pre())
            }

            fn extended(&self) -> bool {
                <$world as World>::pre_extended(self.0.pre())
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
    RouterInstance
);
handle!(
    /// A checked `admission` component: instantiating it is cheap. Cheap to clone.
    AdmissionComponent,
    AdmissionInstance
);
handle!(
    /// A checked `kv-hints` component: instantiating it is cheap. Cheap to clone.
    KvHintsComponent,
    KvHintsInstance
);

impl RouterComponent {
    /// Whether it exports 1.1's `queue-key-at`.
    pub fn has_queue_key_at(&self) -> bool {
        self.extended()
    }

    /// Whether it exports 1.2's `route-packed` (the host then calls it instead of `route`).
    pub fn has_route_packed(&self) -> bool {
        self.0.pre().packed.is_some()
    }
}

impl AdmissionComponent {
    /// Whether it exports 1.1's `placement` (it may place programs on ranks).
    pub fn has_placement(&self) -> bool {
        self.extended()
    }

    /// Whether it exports 1.3's packed calls (the host then calls them instead of `tick`,
    /// `arrival` and `placement`).
    pub fn has_packed(&self) -> bool {
        self.0.pre().packed.is_some()
    }
}

impl KvHintsComponent {
    /// Whether it exports 1.1's `on-outcomes` (it hears what became of its hints).
    pub fn has_on_outcomes(&self) -> bool {
        self.extended()
    }
}
