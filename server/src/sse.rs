//! Server-sent events: drives a `StreamRenderer` over the merged engine events and frames its output as SSE
//! `data:` lines, ending with `data: [DONE]`. The body stream owns the engine streams: when the client goes away the
//! body is dropped, and so are the engine requests (aborted).

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, StreamExt};
use rserve_engine::api::RequestEvent;

use crate::fanout::Merged;

/// Turns engine events into the JSON payloads of SSE `data:` lines.
pub trait StreamRenderer: Send + 'static {
    /// Payloads sent before any engine event (e.g. the role chunks).
    fn start(&mut self) -> Vec<String>;
    /// Payloads for one event of choice `index`.
    fn on_event(&mut self, index: usize, event: RequestEvent) -> Vec<String>;
    /// Payloads after all choices ended (e.g. the usage chunk); `[DONE]` follows.
    fn finish(&mut self) -> Vec<String>;
    /// True after an engine error: the stream stops (other choices are aborted).
    fn failed(&self) -> bool;
}

/// The payload of the last SSE event.
pub const DONE: &str = "[DONE]";

struct Driver<R> {
    renderer: R,
    merged: Option<Merged>,
    queue: VecDeque<String>,
    done: bool,
}

/// The payloads of the whole stream, in order, ending with `[DONE]`.
pub fn payloads<R: StreamRenderer>(mut renderer: R, merged: Merged) -> BoxStream<'static, String> {
    let queue: VecDeque<String> = renderer.start().into();
    let driver = Driver { renderer, merged: Some(merged), queue, done: false };
    stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(payload) = d.queue.pop_front() {
                return Some((payload, d));
            }
            if d.done {
                return None;
            }
            let next = match d.merged.as_mut() {
                Some(m) => m.next().await,
                None => None,
            };
            match next {
                Some((index, event)) => {
                    let out = d.renderer.on_event(index, event);
                    d.queue.extend(out);
                    if d.renderer.failed() {
                        d.merged = None;
                    }
                }
                None => {
                    d.merged = None;
                    let out = d.renderer.finish();
                    d.queue.extend(out);
                    d.queue.push_back(DONE.to_owned());
                    d.done = true;
                }
            }
        }
    })
    .boxed()
}

/// An SSE response (`text/event-stream`) streaming the renderer's payloads, with keep-alive comments so that a
/// client that left during a long wait is noticed.
pub fn response<R: StreamRenderer>(renderer: R, merged: Merged) -> Response {
    let events = payloads(renderer, merged).map(|p| Ok::<Event, Infallible>(Event::default().data(p)));
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}
