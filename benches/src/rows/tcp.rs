//! Rows: TCP on loopback, plain or with TLS 1.3 (tokio-rustls, AES-128-GCM).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::stack::{AsyncStack, BoxFut, Dialer, Listener, Reader, Session, Writer};
use crate::tls::{Tls, SERVER_NAME};

/// TCP (`TCP_NODELAY`), optionally wrapped in TLS.
#[derive(Debug)]
pub struct Tcp {
    tls: Option<Tls>,
}

impl Tcp {
    /// Plain TCP.
    pub fn plain() -> Self {
        Tcp { tls: None }
    }

    /// TCP + tokio-rustls, TLS 1.3, AES-128-GCM only.
    pub fn tls() -> Self {
        Tcp {
            tls: Some(Tls::new()),
        }
    }
}

struct TcpListen {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
}

struct TcpDial {
    server: SocketAddr,
    tls: Option<TlsConnector>,
}

/// One connection: its stream, until a half is taken.
struct TcpSession(Option<(Reader, Writer)>);

impl TcpSession {
    fn take(&mut self) -> anyhow::Result<(Reader, Writer)> {
        self.0
            .take()
            .ok_or_else(|| anyhow::anyhow!("a TCP connection carries one stream"))
    }
}

fn halves<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + 'static>(s: S) -> (Reader, Writer) {
    let (r, w) = tokio::io::split(s);
    (Box::new(r), Box::new(w))
}

impl AsyncStack for Tcp {
    fn name(&self) -> String {
        if self.tls.is_some() {
            "tcp+rustls".into()
        } else {
            "tcp".into()
        }
    }

    fn description(&self) -> String {
        if self.tls.is_some() {
            "TCP loopback + tokio-rustls, TLS 1.3, AES-128-GCM only, TCP_NODELAY".into()
        } else {
            "plain TCP loopback, TCP_NODELAY, no encryption".into()
        }
    }

    fn listen(&self) -> BoxFut<'_, (Box<dyn Listener>, SocketAddr)> {
        Box::pin(async move {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
            let addr = listener.local_addr()?;
            let tls = self
                .tls
                .as_ref()
                .map(|t| TlsAcceptor::from(Arc::new(t.rustls_server())));
            Ok((
                Box::new(TcpListen { listener, tls }) as Box<dyn Listener>,
                addr,
            ))
        })
    }

    fn dialer(&self, server: SocketAddr) -> BoxFut<'_, Box<dyn Dialer>> {
        Box::pin(async move {
            let tls = self
                .tls
                .as_ref()
                .map(|t| TlsConnector::from(Arc::new(t.rustls_client())));
            Ok(Box::new(TcpDial { server, tls }) as Box<dyn Dialer>)
        })
    }
}

impl Listener for TcpListen {
    fn accept(&mut self) -> BoxFut<'_, Box<dyn Session>> {
        Box::pin(async move {
            let (s, _) = self.listener.accept().await?;
            s.set_nodelay(true)?;
            let halves = match &self.tls {
                Some(a) => halves(a.accept(s).await?),
                None => halves(s),
            };
            Ok(Box::new(TcpSession(Some(halves))) as Box<dyn Session>)
        })
    }
}

impl Dialer for TcpDial {
    fn connect(&mut self) -> BoxFut<'_, Box<dyn Session>> {
        Box::pin(async move {
            let s = TcpStream::connect(self.server).await?;
            s.set_nodelay(true)?;
            let halves = match &self.tls {
                Some(c) => {
                    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME)?;
                    halves(c.connect(name, s).await?)
                }
                None => halves(s),
            };
            Ok(Box::new(TcpSession(Some(halves))) as Box<dyn Session>)
        })
    }

    fn shutdown(self: Box<Self>) -> BoxFut<'static, ()> {
        Box::pin(async { Ok(()) })
    }
}

impl Session for TcpSession {
    fn open(&mut self) -> BoxFut<'_, (Reader, Writer)> {
        Box::pin(async move { self.take() })
    }

    fn accept(&mut self) -> BoxFut<'_, (Reader, Writer)> {
        Box::pin(async move { self.take() })
    }

    fn close(self: Box<Self>) -> BoxFut<'static, ()> {
        Box::pin(async { Ok(()) })
    }
}
