//! `#[derive(Declared)]`: a request, declared once on its variant (`weft_proto::access`,
//! `weft_proto::answer`).
//!
//! The enum names its service's response type and the module of its requests' answers:
//! `#[request(response = MetaResponse, answers = meta_answers)]`. Every variant carries
//! `#[request(...)]`, and a variant without one does not compile:
//! - its kind: `reads` (a client may send it, read-only clients too), `changes` (a client may
//!   send it; it changes files, directories or attributes), `members` (only the cluster's
//!   members may), or `kind = EXPR` over the variant's fields (bound by reference);
//! - `answer = TYPE`: what the caller gets out of the response (a type implementing
//!   `weft_proto::answer::Answer` of the service's response);
//! - `inodes(FIELD, ...)`: the inodes it names, each of which must lie in a confined client's
//!   subtree (fields of type `InodeId`);
//! - `sessions(FIELD, ...)`: the client sessions it acts in (fields whose type implements
//!   `weft_proto::access::ActsIn`: a mutation id, a session id, a capability).
//!
//! The derive gives the enum `kind(&self)`, `inodes_named(&self)`, `sessions(&self)` and
//! `answer_fits(&self)`, and the answers module one type alias per variant, named as the
//! variant: the client stubs return `answers::Variant`.

use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::{Data, DeriveInput, Fields, Ident, Type};

/// One variant's declaration.
struct Declared<'a> {
    ident: &'a Ident,
    fields: &'a Fields,
    kind: Tokens,
    answer: Type,
    inodes: Vec<Ident>,
    sessions: Vec<Ident>,
}

/// The enum's declaration: its service's response, and the module of its answers.
struct Service {
    response: Type,
    answers: Ident,
}

pub(crate) fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Enum(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "#[derive(Declared)] is for request enums",
        ));
    };
    let Service { response, answers } = service(input)?;
    let mut declared = Vec::new();
    for variant in &data.variants {
        declared.push(declaration(variant)?);
    }
    let ty = &input.ident;
    let kind_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, d.fields.iter().filter_map(|f| f.ident.as_ref()));
        let kind = &d.kind;
        quote!(#pattern => #kind,)
    });
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
    let aliases = declared.iter().map(|d| {
        let ident = d.ident;
        let answer = &d.answer;
        let doc = format!("What [`{ty}::{ident}`] answers.");
        quote!(#[doc = #doc] pub type #ident = #answer;)
    });
    let module_doc = format!("What each [`{ty}`] answers, as its variant declares.");
    Ok(quote! {
        #[doc = #module_doc]
        #[allow(unused_imports)]
        pub mod #answers {
            use super::*;
            #(#aliases)*
        }

        impl crate::answer::Service for #ty {
            type Response = #response;
        }

        #[allow(dead_code)]
        impl #ty {
            /// What it is to admission: read, change, or for members (its declaration).
            #[allow(unused_variables)]
            pub(crate) fn kind(&self) -> crate::access::Kind {
                match self {
                    #(#kind_arms)*
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
    })
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
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("request")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("response") {
                response = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("answers") {
                answers = Some(meta.value()?.parse()?);
            } else {
                return Err(meta.error("expected response = TYPE or answers = MODULE"));
            }
            Ok(())
        })?;
    }
    match (response, answers) {
        (Some(response), Some(answers)) => Ok(Service { response, answers }),
        _ => Err(syn::Error::new_spanned(
            &input.ident,
            "a request enum names its service: #[request(response = TYPE, answers = MODULE)]",
        )),
    }
}

fn declaration(variant: &syn::Variant) -> syn::Result<Declared<'_>> {
    let mut kind = None;
    let mut answer = None;
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
                    let ident = field
                        .path
                        .get_ident()
                        .ok_or_else(|| field.error("a field of the variant"))?;
                    list.push(ident.clone());
                    Ok(())
                })
            };
            if meta.path.is_ident("reads") {
                kind = Some(quote!(crate::access::Kind::Reads));
            } else if meta.path.is_ident("changes") {
                kind = Some(quote!(crate::access::Kind::Changes));
            } else if meta.path.is_ident("members") {
                kind = Some(quote!(crate::access::Kind::Members));
            } else if meta.path.is_ident("kind") {
                let expr: syn::Expr = meta.value()?.parse()?;
                kind = Some(quote!(#expr));
            } else if meta.path.is_ident("answer") {
                answer = Some(meta.value()?.parse::<Type>()?);
            } else if meta.path.is_ident("inodes") {
                named(&mut inodes)?;
            } else if meta.path.is_ident("sessions") {
                named(&mut sessions)?;
            } else {
                return Err(meta.error(
                    "expected reads, changes, members, kind = EXPR, answer = TYPE, inodes(..) \
                     or sessions(..)",
                ));
            }
            Ok(())
        })?;
    }
    if !found {
        return Err(syn::Error::new_spanned(
            &variant.ident,
            "every request is declared: #[request(reads | changes | members, answer = TYPE, ...)]",
        ));
    }
    let kind = kind.ok_or_else(|| {
        syn::Error::new_spanned(
            &variant.ident,
            "#[request(...)] names the request's kind: reads, changes, members or kind = EXPR",
        )
    })?;
    let answer = answer.ok_or_else(|| {
        syn::Error::new_spanned(
            &variant.ident,
            "#[request(...)] names what the request answers: answer = TYPE",
        )
    })?;
    let names_fields = !inodes.is_empty() || !sessions.is_empty();
    if names_fields && !matches!(variant.fields, Fields::Named(_)) {
        return Err(syn::Error::new_spanned(
            &variant.ident,
            "inodes(..) and sessions(..) name fields of a variant with named fields",
        ));
    }
    Ok(Declared {
        ident: &variant.ident,
        fields: &variant.fields,
        kind,
        answer,
        inodes,
        sessions,
    })
}
