//! The host sessions a gateway serves, for what its upstreams announce outside any one
//! call: an update of a resource a host subscribed to, and a changed list of resources
//! or prompts (`docs/mcp.md`, "Subscriptions and changed lists"). A handshake-era host
//! session is told through its connection; a 2026-07-28 host's `subscriptions/listen`
//! stream through the stream's sink, which keeps to what the stream accepted.
#![allow(
    deprecated,
    reason = "2026-07-28 moves subscriptions to subscriptions/listen, but hosts and upstreams of the handshake era still subscribe, and the gateway forwards what they send"
)]

use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
};

use rmcp::{
    RoleServer,
    model::ResourceUpdatedNotificationParam,
    service::{Peer, SubscriptionSink},
};

use crate::relay::RELAY_WAIT;

/// The host sessions and what they subscribed to.
#[derive(Debug, Default)]
pub(crate) struct Hosts {
    state: Mutex<State>,
}

/// Who is told: a handshake-era host session, by its number, or a 2026-07-28
/// `subscriptions/listen` stream, by a number of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Key {
    Session(u64),
    Listener(u64),
}

/// How they are told.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Peer(Peer<RoleServer>),
    Sink(SubscriptionSink),
}

#[derive(Debug, Default)]
struct State {
    targets: HashMap<Key, Target>,
    /// By resource URI: the upstream that serves it and who subscribed to it.
    subscribed: HashMap<String, (String, BTreeSet<Key>)>,
}

impl State {
    /// Forgets `key` and what it subscribed to; the URIs nobody subscribes to any more.
    fn forget(&mut self, key: Key) -> Vec<String> {
        self.targets.remove(&key);
        let mut unwatched = Vec::new();
        self.subscribed.retain(|uri, (_, keys)| {
            if keys.remove(&key) && keys.is_empty() {
                unwatched.push(uri.clone());
            }
            !keys.is_empty()
        });
        unwatched
    }
}

/// A list an upstream says changed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Changed {
    Resources,
    Prompts,
}

impl Hosts {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `key` is told through `target` from now on.
    pub(crate) fn joined(&self, key: Key, target: Target) {
        self.lock().targets.insert(key, target);
    }

    /// Forgets `key` and what it subscribed to; the URIs nobody subscribes to any more
    /// (their upstreams are to be told).
    pub(crate) fn left(&self, key: Key) -> Vec<String> {
        self.lock().forget(key)
    }

    /// Records that `key` (told through `target`) subscribes to `uri`, which `upstream`
    /// serves; whether it is the first to (the upstream is to be asked).
    pub(crate) fn subscribe(&self, uri: &str, upstream: &str, key: Key, target: Target) -> bool {
        let mut state = self.lock();
        state.targets.insert(key, target);
        let (_, keys) = state
            .subscribed
            .entry(uri.to_owned())
            .or_insert_with(|| (upstream.to_owned(), BTreeSet::new()));
        keys.insert(key) && keys.len() == 1
    }

    /// Forgets that `key` subscribes to `uri`; whether it was the last to (the upstream
    /// is to be told).
    pub(crate) fn unsubscribe(&self, uri: &str, key: Key) -> bool {
        let mut state = self.lock();
        let Some((_, keys)) = state.subscribed.get_mut(uri) else { return false };
        let last = keys.remove(&key) && keys.is_empty();
        if keys.is_empty() {
            state.subscribed.remove(uri);
        }
        last
    }

    /// The URIs subscribed to on `upstream`: a new connection to it subscribes again.
    pub(crate) fn subscriptions(&self, upstream: &str) -> Vec<String> {
        let state = self.lock();
        let mut uris: Vec<String> = state
            .subscribed
            .iter()
            .filter(|(_, (served_by, _))| served_by == upstream)
            .map(|(uri, _)| uri.clone())
            .collect();
        uris.sort();
        uris
    }

    /// The targets of `keys` still connected; a host session whose connection closed is
    /// forgotten (a listener is forgotten when its stream ends).
    fn live(&self, keys: impl Fn(&State) -> Vec<Key>) -> Vec<Target> {
        let mut state = self.lock();
        let (mut live, mut gone) = (Vec::new(), Vec::new());
        for key in keys(&state) {
            match state.targets.get(&key) {
                Some(Target::Peer(peer)) if peer.is_transport_closed() => gone.push(key),
                Some(target) => live.push(target.clone()),
                None => gone.push(key),
            }
        }
        for key in gone {
            state.forget(key);
        }
        live
    }

    /// A resource's update, to each subscribed to it.
    pub(crate) async fn updated(&self, params: ResourceUpdatedNotificationParam) {
        let subscribers = self.live(|state| {
            state
                .subscribed
                .get(&params.uri)
                .map(|(_, keys)| keys.iter().copied().collect())
                .unwrap_or_default()
        });
        for target in subscribers {
            match target {
                Target::Peer(peer) => tell(peer.notify_resource_updated(params.clone())).await,
                Target::Sink(sink) => tell(sink.notify_resource_updated(params.uri.clone())).await,
            }
        }
    }

    /// A changed list, to every host session and every listener that accepted it (a
    /// stream that did not ask for that list refuses it, by its filter).
    pub(crate) async fn changed(&self, which: Changed) {
        for target in self.live(|state| state.targets.keys().copied().collect()) {
            match (target, which) {
                (Target::Peer(peer), Changed::Resources) => {
                    tell(peer.notify_resource_list_changed()).await;
                }
                (Target::Peer(peer), Changed::Prompts) => {
                    tell(peer.notify_prompt_list_changed()).await;
                }
                (Target::Sink(sink), Changed::Resources) => {
                    tell(sink.notify_resource_list_changed()).await;
                }
                (Target::Sink(sink), Changed::Prompts) => {
                    tell(sink.notify_prompt_list_changed()).await;
                }
            }
        }
    }
}

/// Waits at most [`RELAY_WAIT`] for `told`: a host that went away, or does not read,
/// misses it.
async fn tell<E>(told: impl Future<Output = Result<(), E>>) {
    let _ = tokio::time::timeout(RELAY_WAIT, told).await;
}
