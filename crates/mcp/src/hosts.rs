//! The host sessions a gateway serves, for what its upstreams announce outside any one
//! call: an update of a resource a host subscribed to, and a changed list of resources
//! or prompts (`docs/mcp.md`, "Subscriptions and changed lists").
#![allow(
    deprecated,
    reason = "2026-07-28 moves subscriptions to subscriptions/listen, but hosts and upstreams of the handshake era still subscribe, and the gateway forwards what they send"
)]

use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
};

use rmcp::{RoleServer, model::ResourceUpdatedNotificationParam, service::Peer};

use crate::relay::RELAY_WAIT;

/// The host sessions and what they subscribed to.
#[derive(Debug, Default)]
pub(crate) struct Hosts {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Every handshake-era host session, by number.
    sessions: HashMap<u64, Peer<RoleServer>>,
    /// By resource URI: the upstream that serves it and the sessions subscribed to it.
    subscribed: HashMap<String, (String, BTreeSet<u64>)>,
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

    /// Host `session` is connected, through `peer`.
    pub(crate) fn joined(&self, session: u64, peer: Peer<RoleServer>) {
        self.lock().sessions.insert(session, peer);
    }

    /// Records that `session` subscribes to `uri`, which `upstream` serves; whether it is
    /// the first to (the upstream is to be asked).
    pub(crate) fn subscribe(
        &self,
        uri: &str,
        upstream: &str,
        session: u64,
        peer: Peer<RoleServer>,
    ) -> bool {
        let mut state = self.lock();
        state.sessions.insert(session, peer);
        let (_, sessions) = state
            .subscribed
            .entry(uri.to_owned())
            .or_insert_with(|| (upstream.to_owned(), BTreeSet::new()));
        sessions.insert(session) && sessions.len() == 1
    }

    /// Forgets that `session` subscribes to `uri`; whether it was the last to (the
    /// upstream is to be told).
    pub(crate) fn unsubscribe(&self, uri: &str, session: u64) -> bool {
        let mut state = self.lock();
        let Some((_, sessions)) = state.subscribed.get_mut(uri) else { return false };
        let last = sessions.remove(&session) && sessions.is_empty();
        if sessions.is_empty() {
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

    /// The sessions still connected among `sessions`; the others are forgotten.
    fn live(&self, sessions: impl Fn(&State) -> Vec<u64>) -> Vec<Peer<RoleServer>> {
        let mut state = self.lock();
        let (mut live, mut gone) = (Vec::new(), Vec::new());
        for session in sessions(&state) {
            match state.sessions.get(&session) {
                Some(peer) if !peer.is_transport_closed() => live.push(peer.clone()),
                _ => gone.push(session),
            }
        }
        for session in gone {
            state.sessions.remove(&session);
            state.subscribed.retain(|_, (_, sessions)| {
                sessions.remove(&session);
                !sessions.is_empty()
            });
        }
        live
    }

    /// A resource's update, to each session subscribed to it.
    pub(crate) async fn updated(&self, params: ResourceUpdatedNotificationParam) {
        let subscribers = self.live(|state| {
            state
                .subscribed
                .get(&params.uri)
                .map(|(_, sessions)| sessions.iter().copied().collect())
                .unwrap_or_default()
        });
        for peer in subscribers {
            let told = peer.notify_resource_updated(params.clone());
            let _ = tokio::time::timeout(RELAY_WAIT, told).await;
        }
    }

    /// A changed list, to every session.
    pub(crate) async fn changed(&self, which: Changed) {
        for peer in self.live(|state| state.sessions.keys().copied().collect()) {
            let _ = match which {
                Changed::Resources => {
                    tokio::time::timeout(RELAY_WAIT, peer.notify_resource_list_changed()).await
                }
                Changed::Prompts => {
                    tokio::time::timeout(RELAY_WAIT, peer.notify_prompt_list_changed()).await
                }
            };
        }
    }
}
