//! An AWS SDK HTTP client made of one connector, for tests that stand
//! between an SDK client and the service it calls (to hold requests, or to
//! rewrite them for an emulator that speaks another protocol).

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

/// An SDK HTTP client whose every request goes to the connector it wraps,
/// whatever the client's settings (timeouts, TLS) ask for: pass it to a
/// client config's `http_client`.
#[derive(Debug, Clone)]
pub struct ConnectorClient<C>(pub C);

impl<C> HttpClient for ConnectorClient<C>
where
    C: HttpConnector + Clone + 'static,
{
    fn http_connector(
        &self,
        _: &HttpConnectorSettings,
        _: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.0.clone())
    }
}
