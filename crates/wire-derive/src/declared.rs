//! `#[derive(Declared)]`: a request, declared once on its variant (`weft_proto::access`,
//! `weft_proto::answer`).
//!
//! The enum names its service's response type and the module of its requests' answers:
//! `#[request(response = MetaResponse, answers = meta_answers)]`, and, with `calls = TRAIT`,
//! the trait of its client stubs. Every variant carries `#[request(...)]`, and a variant
//! without one does not compile:
//! - whether it mutates: `reads` (it changes no file, directory, attribute or setting of the
//!   cluster; read-only clients may send it: a session's opens and locks are not changes),
//!   `changes` (it does), or `kind = EXPR` over the variant's fields (bound by reference),
//!   for a request that is one or the other by its arguments;
//! - `members`: only the cluster's members may send it; without it, clients may too;
//! - `route = home(FIELD)` (the home of an inode), `route = holder(DIR, NAME)` (the home
//!   of the shard of a directory that holds a name), `route = target(FIELD)` (a storage
//!   target's server); without it, the request goes to the server its sender chose (a
//!   member's or a session's own business);
//! - `answer = TYPE`: what the caller gets out of the response (a type implementing
//!   `weft_proto::answer::Answer` of the service's response);
//! - `stub = NAME` names its client stub (the variant's name in snake case otherwise), and
//!   `stub = none` leaves it without one (a request with a payload, or whose stub does more
//!   than ask);
//! - `inodes(FIELD, ...)`: the inodes it names, each of which must lie in a confined client's
//!   subtree (fields of type `InodeId`);
//! - `sessions(FIELD, ...)`: the client sessions it acts in (fields whose type implements
//!   `weft_proto::access::ActsIn`: a mutation id, a session id, a capability).
//!
//! The derive gives the enum `kind(&self)`, `mutates(&self)`, `route(&self)`,
//! `inodes_named(&self)`, `sessions(&self)` and `answer_fits(&self)`, the answers module
//! one type alias per variant, named as the variant, and the calls trait one stub per
//! variant: a method that takes the variant's fields (a `String` as anything that becomes
//! one) and answers `answers::Variant`. A client implements the trait's `ask`.

use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Fields, Ident, Type};

/// One variant's declaration.
struct Declared<'a> {
    variant: &'a syn::Variant,
    ident: &'a Ident,
    fields: &'a Fields,
    /// Whether it reads or changes: a `crate::access::Kind` expression.
    access: Tokens,
    members: bool,
    route: Route,
    answer: Type,
    stub: Stub,
    inodes: Vec<Ident>,
    sessions: Vec<Ident>,
}

/// What a request routes by.
enum Route {
    Home(Ident),
    Holder(Ident, Ident),
    Target(Ident),
    Chosen,
}

/// A variant's client stub.
enum Stub {
    Named(Ident),
    None,
}

/// The enum's declaration: its service's response, the module of its answers, the trait of
/// its stubs.
struct Service {
    response: Type,
    answers: Ident,
    calls: Option<Ident>,
}

pub(crate) fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Enum(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "#[derive(Declared)] is for request enums",
        ));
    };
    let service = service(input)?;
    let mut declared = Vec::new();
    for variant in &data.variants {
        declared.push(declaration(variant)?);
    }
    let ty = &input.ident;
    let Service {
        response, answers, ..
    } = &service;
    let accessors = accessors(ty, &service, &declared);
    let aliases = declared.iter().map(|d| {
        let ident = d.ident;
        let answer = &d.answer;
        let doc = format!("What [`{ty}::{ident}`] answers.");
        quote!(#[doc = #doc] pub type #ident = #answer;)
    });
    let calls = calls(ty, &service, &declared)?;
    let module_doc = format!("What each [`{ty}`] answers, as its variant declares.");
    Ok(quote! {
        #[doc = #module_doc]
        #[allow(unused_imports)]
        pub mod #answers {
            use super::*;
            #(#aliases)*
        }

        #calls

        impl crate::answer::Service for #ty {
            type Response = #response;
        }

        #accessors
    })
}

/// What the enum's declarations give each request: `kind`, `mutates`, `route`,
/// `inodes_named`, `sessions` and `answer_fits`.
fn accessors(ty: &Ident, service: &Service, declared: &[Declared<'_>]) -> Tokens {
    let Service {
        response, answers, ..
    } = service;
    let kind_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, d.fields.iter().filter_map(|f| f.ident.as_ref()));
        let kind = if d.members {
            quote!(crate::access::Kind::Members)
        } else {
            d.access.clone()
        };
        quote!(#pattern => #kind,)
    });
    let mutates_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, d.fields.iter().filter_map(|f| f.ident.as_ref()));
        let access = &d.access;
        quote!(#pattern => #access == crate::access::Kind::Changes,)
    });
    let route_arms = declared.iter().map(|d| route_arm(ty, d));
    let inode_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, d.inodes.iter());
        let inodes = &d.inodes;
        quote!(#pattern => ::std::vec![#(*#inodes),*],)
    });
    let session_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, d.sessions.iter());
        let sessions = &d.sessions;
        quote!(#pattern => {
            let mut sessions = ::std::vec::Vec::new();
            #(crate::access::ActsIn::acts_in(#sessions, &mut sessions);)*
            sessions
        })
    });
    let fits_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, std::iter::empty());
        let ident = d.ident;
        quote!(#pattern => <#answers::#ident as crate::answer::Answer<#response>>::fits,)
    });
    quote! {
    #[allow(dead_code)]
    impl #ty {
        /// What it is to admission: read, change, or for members (its declaration).
        #[allow(unused_variables)]
        pub(crate) fn kind(&self) -> crate::access::Kind {
            match self {
                #(#kind_arms)*
            }
        }

        /// Whether it changes files, directories, attributes or the cluster's settings
        /// (its declaration); a read-only client may not send such a request.
        #[allow(unused_variables)]
        pub fn mutates(&self) -> bool {
            match self {
                #(#mutates_arms)*
            }
        }

        /// Where it goes (its declaration): the server that serves what it routes by.
        pub fn route(&self) -> crate::access::Routing<'_> {
            match self {
                #(#route_arms)*
            }
        }

        /// The inodes it names, each of which must lie in a confined client's subtree
        /// (its declaration).
        pub fn inodes_named(&self) -> ::std::vec::Vec<crate::ids::InodeId> {
            match self {
                #(#inode_arms)*
            }
        }

        /// The client sessions it acts in: whose replies, opens, locks or changes it
        /// touches (its declaration).
        pub(crate) fn sessions(&self) -> ::std::vec::Vec<crate::ids::ClientId> {
            match self {
                #(#session_arms)*
            }
        }

        /// Whether a response carries the answer it declares: a server checks what it
        /// answers with this.
        pub fn answer_fits(&self) -> fn(&#response) -> bool {
            match self {
                #(#fits_arms)*
            }
        }
    }
    }
}

/// The arm of `route` for `declared`'s variant.
fn route_arm(ty: &Ident, d: &Declared<'_>) -> Tokens {
    match &d.route {
        Route::Home(inode) => {
            let pattern = pattern(ty, d, std::iter::once(inode));
            quote!(#pattern => crate::access::Routing::Home(*#inode),)
        }
        Route::Holder(dir, name) => {
            let pattern = pattern(ty, d, [dir, name].into_iter());
            quote!(#pattern => crate::access::Routing::Holder(*#dir, #name.as_str()),)
        }
        Route::Target(target) => {
            let pattern = pattern(ty, d, std::iter::once(target));
            quote!(#pattern => crate::access::Routing::Target(*#target),)
        }
        Route::Chosen => {
            let pattern = pattern(ty, d, std::iter::empty());
            quote!(#pattern => crate::access::Routing::Chosen,)
        }
    }
}

/// The trait of the enum's client stubs, when it names one: `ask`, which a client
/// implements, and one stub per variant that asks its request.
fn calls(ty: &Ident, service: &Service, declared: &[Declared<'_>]) -> syn::Result<Tokens> {
    let Some(calls) = &service.calls else {
        return Ok(Tokens::new());
    };
    let Service {
        response, answers, ..
    } = service;
    let mut stubs = Vec::new();
    for d in declared {
        let Stub::Named(stub) = &d.stub else {
            continue;
        };
        let ident = d.ident;
        let docs = d.variant.attrs.iter().filter(|a| a.path().is_ident("doc"));
        let (params, request) = match d.fields {
            Fields::Named(fields) => {
                let mut params = Vec::new();
                let mut values = Vec::new();
                for field in &fields.named {
                    let name = field.ident.as_ref().expect("named field");
                    let field_ty = &field.ty;
                    if is_string(field_ty) {
                        params
                            .push(quote!(#name: impl ::std::convert::Into<::std::string::String>));
                        values.push(quote!(#name: #name.into()));
                    } else {
                        params.push(quote!(#name: #field_ty));
                        values.push(quote!(#name));
                    }
                }
                (params, quote!(#ty::#ident { #(#values),* }))
            }
            Fields::Unit => (Vec::new(), quote!(#ty::#ident)),
            Fields::Unnamed(_) => {
                return Err(syn::Error::new_spanned(
                    ident,
                    "a stub asks a variant with named fields: name them, or say stub = none",
                ))
            }
        };
        stubs.push(quote! {
            #(#docs)*
            #[allow(clippy::too_many_arguments)]
            fn #stub(&self, #(#params),*) -> impl ::std::future::Future<
                Output = ::std::result::Result<#answers::#ident, Self::Error>,
            > + ::std::marker::Send {
                self.ask(#request)
            }
        });
    }
    let doc = format!(
        "A client of [`{ty}`]s: one stub per request, each answering what its variant declares."
    );
    Ok(quote! {
        #[doc = #doc]
        pub trait #calls: ::std::marker::Sync {
            /// What a call fails with.
            type Error;

            /// Sends `request` and answers what it declares.
            fn ask<A: crate::answer::Answer<#response> + ::std::marker::Send>(
                &self,
                request: #ty,
            ) -> impl ::std::future::Future<Output = ::std::result::Result<A, Self::Error>>
                   + ::std::marker::Send;

            #(#stubs)*
        }
    })
}

/// Whether `ty` is `String`.
fn is_string(ty: &Type) -> bool {
    matches!(ty, Type::Path(path) if path.qself.is_none() && path.path.is_ident("String"))
}

/// The pattern of `declared`'s variant binding `bound` of its fields.
fn pattern<'a>(
    ty: &Ident,
    declared: &Declared<'_>,
    bound: impl Iterator<Item = &'a Ident>,
) -> Tokens {
    let ident = declared.ident;
    match declared.fields {
        Fields::Named(_) => {
            let bound: Vec<&Ident> = bound.collect();
            quote!(#ty::#ident { #(#bound,)* .. })
        }
        Fields::Unnamed(_) => quote!(#ty::#ident(..)),
        Fields::Unit => quote!(#ty::#ident),
    }
}

fn service(input: &DeriveInput) -> syn::Result<Service> {
    let mut response = None;
    let mut answers = None;
    let mut calls = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("request")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("response") {
                response = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("answers") {
                answers = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("calls") {
                calls = Some(meta.value()?.parse()?);
            } else {
                return Err(
                    meta.error("expected response = TYPE, answers = MODULE or calls = TRAIT")
                );
            }
            Ok(())
        })?;
    }
    match (response, answers) {
        (Some(response), Some(answers)) => Ok(Service {
            response,
            answers,
            calls,
        }),
        _ => Err(syn::Error::new_spanned(
            &input.ident,
            "a request enum names its service: #[request(response = TYPE, answers = MODULE)]",
        )),
    }
}

fn declaration(variant: &syn::Variant) -> syn::Result<Declared<'_>> {
    let mut access = None;
    let mut members = false;
    let mut route = Route::Chosen;
    let mut answer = None;
    let mut stub = Stub::Named(format_ident!("{}", snake_case(&variant.ident.to_string())));
    let mut inodes = Vec::new();
    let mut sessions = Vec::new();
    let mut found = false;
    for attr in variant
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("request"))
    {
        found = true;
        attr.parse_nested_meta(|meta| {
            let named = |list: &mut Vec<Ident>| {
                meta.parse_nested_meta(|field| {
                    list.push(field_of(&field)?);
                    Ok(())
                })
            };
            if meta.path.is_ident("reads") {
                access = Some(quote!(crate::access::Kind::Reads));
            } else if meta.path.is_ident("changes") {
                access = Some(quote!(crate::access::Kind::Changes));
            } else if meta.path.is_ident("members") {
                members = true;
            } else if meta.path.is_ident("kind") {
                let expr: syn::Expr = meta.value()?.parse()?;
                access = Some(quote!(#expr));
            } else if meta.path.is_ident("route") {
                route = routing(meta.value()?)?;
            } else if meta.path.is_ident("answer") {
                answer = Some(meta.value()?.parse::<Type>()?);
            } else if meta.path.is_ident("stub") {
                let name: Ident = meta.value()?.parse()?;
                stub = if name == "none" {
                    Stub::None
                } else {
                    Stub::Named(name)
                };
            } else if meta.path.is_ident("inodes") {
                named(&mut inodes)?;
            } else if meta.path.is_ident("sessions") {
                named(&mut sessions)?;
            } else {
                return Err(meta.error(
                    "expected reads, changes, kind = EXPR, members, route = .., answer = TYPE, \
                     stub = NAME, inodes(..) or sessions(..)",
                ));
            }
            Ok(())
        })?;
    }
    if !found {
        return Err(syn::Error::new_spanned(
            &variant.ident,
            "every request is declared: #[request(reads | changes, answer = TYPE, ...)]",
        ));
    }
    let access = access.ok_or_else(|| {
        syn::Error::new_spanned(
            &variant.ident,
            "#[request(...)] says whether the request mutates: reads, changes or kind = EXPR",
        )
    })?;
    let answer = answer.ok_or_else(|| {
        syn::Error::new_spanned(
            &variant.ident,
            "#[request(...)] names what the request answers: answer = TYPE",
        )
    })?;
    let names_fields =
        !inodes.is_empty() || !sessions.is_empty() || !matches!(route, Route::Chosen);
    if names_fields && !matches!(variant.fields, Fields::Named(_)) {
        return Err(syn::Error::new_spanned(
            &variant.ident,
            "inodes(..), sessions(..) and route name fields of a variant with named fields",
        ));
    }
    Ok(Declared {
        variant,
        ident: &variant.ident,
        fields: &variant.fields,
        access,
        members,
        route,
        answer,
        stub,
        inodes,
        sessions,
    })
}

/// `home(FIELD)`, `holder(DIR, NAME)` or `target(FIELD)`.
fn routing(input: syn::parse::ParseStream<'_>) -> syn::Result<Route> {
    let expr: syn::Expr = input.parse()?;
    let syn::Expr::Call(call) = &expr else {
        return Err(syn::Error::new_spanned(
            &expr,
            "home(..), holder(..) or target(..)",
        ));
    };
    let syn::Expr::Path(function) = &*call.func else {
        return Err(syn::Error::new_spanned(
            &call.func,
            "home, holder or target",
        ));
    };
    let mut fields = Vec::new();
    for arg in &call.args {
        match arg {
            syn::Expr::Path(path) if path.path.get_ident().is_some() => {
                fields.push(path.path.get_ident().expect("an ident").clone());
            }
            other => return Err(syn::Error::new_spanned(other, "a field of the variant")),
        }
    }
    let which = function.path.get_ident().map(Ident::to_string);
    match (which.as_deref(), fields.as_slice()) {
        (Some("home"), [inode]) => Ok(Route::Home(inode.clone())),
        (Some("holder"), [dir, name]) => Ok(Route::Holder(dir.clone(), name.clone())),
        (Some("target"), [target]) => Ok(Route::Target(target.clone())),
        _ => Err(syn::Error::new_spanned(
            call,
            "expected route = home(INODE), holder(DIR, NAME) or target(TARGET)",
        )),
    }
}

fn field_of(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Ident> {
    meta.path
        .get_ident()
        .cloned()
        .ok_or_else(|| meta.error("a field of the variant"))
}

/// `GetAttr` as `get_attr`.
fn snake_case(name: &str) -> String {
    let mut snake = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.extend(c.to_lowercase());
    }
    snake
}
