//! `#[derive(Wire)]`: `serde::Serialize` and `serde::Deserialize` for an enum that crosses the
//! wire or is stored on disk, with each variant's tag written in the source
//! (`#[wire(tag = N)]`) instead of taken from its position (docs/design/protocol.md,
//! "Encodings").
//!
//! The encoding is serde's: postcard writes the tag as a varint and then the variant's fields,
//! exactly as for a derived enum whose variant has that position, so a tag equal to a
//! variant's old position changes no byte. Human-readable formats (the JSON of management's
//! web page) see the variant's name, renamed as `#[wire(rename_all = "snake_case")]` (or
//! `"kebab-case"`, `"lowercase"`) says. A variant added in a later protocol version is marked
//! `#[wire(tag = N, since = V)]`: encoding it for a peer of an older version
//! (`weft_proto::wire::version`) fails instead of sending what the peer cannot read. Field
//! attributes `#[serde(...)]` of struct and tuple variants apply as on a struct.
//!
//! The derive also gives the enum `WIRE_TAGS` (every tag with its variant's name) and
//! `wire_tag(&self)`, with which the golden-byte tests check that every variant is covered.
//!
//! `#[derive(Declared)]` declares, on each variant of a request enum, what the request is to
//! admission and what it answers (see the `declared` module).

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::{parse_macro_input, Attribute, Data, DeriveInput, Fields, Ident, LitInt, LitStr};

mod declared;

/// Derives a request enum's `kind`, `inodes_named`, `sessions`, `answer_fits` and answers
/// module from its `#[request(...)]` declarations (see the `declared` module).
#[proc_macro_derive(Declared, attributes(request))]
pub fn derive_declared(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    declared::expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Derives `Serialize` and `Deserialize` with explicit variant tags (see the crate docs).
#[proc_macro_derive(Wire, attributes(wire, serde))]
pub fn derive_wire(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

struct Variant<'a> {
    ident: &'a Ident,
    name: String,
    tag: u32,
    since: Option<u16>,
    fields: &'a Fields,
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Enum(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "#[derive(Wire)] is for enums; structs derive serde's traits",
        ));
    };
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &input.generics,
            "#[derive(Wire)] does not take generic enums",
        ));
    }
    let rename_all = enum_rename(&input.attrs)?;
    let mut variants = Vec::new();
    for variant in &data.variants {
        let (tag, since) = variant_attrs(&variant.attrs, &variant.ident)?;
        if let Some(other) = variants.iter().find(|v: &&Variant| v.tag == tag) {
            return Err(syn::Error::new_spanned(
                &variant.ident,
                format!("tag {tag} is also the tag of {}", other.ident),
            ));
        }
        variants.push(Variant {
            ident: &variant.ident,
            name: rename(&variant.ident.to_string(), rename_all.as_deref()),
            tag,
            since,
            fields: &variant.fields,
        });
    }
    let ty = &input.ident;
    let ty_name = ty.to_string();
    let serialize_arms = variants.iter().map(|v| serialize_arm(&ty_name, v));
    let tags: Vec<u32> = variants.iter().map(|v| v.tag).collect();
    let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
    let tag_arms = variants.iter().map(|v| {
        let ident = v.ident;
        let tag = v.tag;
        quote!(#ty::#ident { .. } => #tag,)
    });
    let deserialize = deserialize_impl(ty, &variants);

    Ok(quote! {
        impl ::serde::Serialize for #ty {
            fn serialize<__S: ::serde::Serializer>(
                &self,
                __serializer: __S,
            ) -> ::core::result::Result<__S::Ok, __S::Error> {
                match self {
                    #(#serialize_arms)*
                }
            }
        }

        #deserialize

        impl #ty {
            /// Every variant's wire tag and name (`#[derive(Wire)]`).
            #[doc(hidden)]
            pub const WIRE_TAGS: &'static [(u32, &'static str)] = &[#((#tags, #names)),*];

            /// This variant's wire tag (`#[derive(Wire)]`).
            #[doc(hidden)]
            pub fn wire_tag(&self) -> u32 {
                match self {
                    #(#tag_arms)*
                }
            }
        }
    })
}

/// `Deserialize` for the enum `ty` of `variants`: its tag read as a number (postcard) or as
/// the variant's name (human-readable formats), then the variant's fields.
fn deserialize_impl(ty: &Ident, variants: &[Variant<'_>]) -> Tokens {
    let ty_name = ty.to_string();
    let deserialize_arms = variants.iter().map(|v| deserialize_arm(ty, v));
    let tags: Vec<u32> = variants.iter().map(|v| v.tag).collect();
    let tags64: Vec<u64> = tags.iter().map(|&tag| u64::from(tag)).collect();
    let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
    let byte_names: Vec<syn::LitByteStr> = names
        .iter()
        .map(|name| syn::LitByteStr::new(name.as_bytes(), Span::call_site()))
        .collect();
    let expecting = format!("a variant of {ty_name}");
    quote! {
        impl<'de> ::serde::Deserialize<'de> for #ty {
            fn deserialize<__D: ::serde::Deserializer<'de>>(
                __deserializer: __D,
            ) -> ::core::result::Result<Self, __D::Error> {
                const VARIANTS: &[&str] = &[#(#names),*];
                struct __Tag(u32);
                struct __TagVisitor;
                impl<'de> ::serde::de::Visitor<'de> for __TagVisitor {
                    type Value = __Tag;
                    fn expecting(
                        &self,
                        formatter: &mut ::core::fmt::Formatter<'_>,
                    ) -> ::core::fmt::Result {
                        formatter.write_str(#expecting)
                    }
                    fn visit_u64<__E: ::serde::de::Error>(
                        self,
                        value: u64,
                    ) -> ::core::result::Result<__Tag, __E> {
                        match value {
                            #(#tags64 => ::core::result::Result::Ok(__Tag(#tags)),)*
                            _ => ::core::result::Result::Err(__E::invalid_value(
                                ::serde::de::Unexpected::Unsigned(value),
                                &self,
                            )),
                        }
                    }
                    fn visit_str<__E: ::serde::de::Error>(
                        self,
                        value: &str,
                    ) -> ::core::result::Result<__Tag, __E> {
                        match value {
                            #(#names => ::core::result::Result::Ok(__Tag(#tags)),)*
                            _ => ::core::result::Result::Err(__E::unknown_variant(value, VARIANTS)),
                        }
                    }
                    fn visit_bytes<__E: ::serde::de::Error>(
                        self,
                        value: &[u8],
                    ) -> ::core::result::Result<__Tag, __E> {
                        match value {
                            #(#byte_names => ::core::result::Result::Ok(__Tag(#tags)),)*
                            _ => ::core::result::Result::Err(__E::invalid_value(
                                ::serde::de::Unexpected::Bytes(value),
                                &self,
                            )),
                        }
                    }
                }
                impl<'de> ::serde::Deserialize<'de> for __Tag {
                    fn deserialize<__D2: ::serde::Deserializer<'de>>(
                        deserializer: __D2,
                    ) -> ::core::result::Result<__Tag, __D2::Error> {
                        deserializer.deserialize_identifier(__TagVisitor)
                    }
                }
                struct __Visitor;
                impl<'de> ::serde::de::Visitor<'de> for __Visitor {
                    type Value = #ty;
                    fn expecting(
                        &self,
                        formatter: &mut ::core::fmt::Formatter<'_>,
                    ) -> ::core::fmt::Result {
                        formatter.write_str(#expecting)
                    }
                    fn visit_enum<__A: ::serde::de::EnumAccess<'de>>(
                        self,
                        data: __A,
                    ) -> ::core::result::Result<#ty, __A::Error> {
                        #[allow(unused_imports)]
                        use ::serde::de::VariantAccess as _;
                        let (__tag, __variant) = data.variant::<__Tag>()?;
                        match __tag.0 {
                            #(#deserialize_arms)*
                            other => ::core::result::Result::Err(
                                <__A::Error as ::serde::de::Error>::custom(
                                    ::core::format_args!("no variant of {} has tag {other}", #ty_name),
                                ),
                            ),
                        }
                    }
                }
                __deserializer.deserialize_enum(#ty_name, VARIANTS, __Visitor)
            }
        }
    }
}

/// The fields' `#[serde(...)]` attributes, which the helper structs carry.
fn serde_attrs(attrs: &[Attribute]) -> Vec<&Attribute> {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident("serde"))
        .collect()
}

/// The fields of a helper struct standing for a variant's fields, with their serde
/// attributes: borrowed (`&'__w`) to serialize, owned to deserialize; named for a variant
/// with named fields.
fn helper_fields<'a>(
    fields: impl IntoIterator<Item = &'a syn::Field>,
    borrowed: bool,
) -> Vec<Tokens> {
    fields
        .into_iter()
        .map(|field| {
            let attrs = serde_attrs(&field.attrs);
            let ty = &field.ty;
            let ty = if borrowed {
                quote!(&'__w #ty)
            } else {
                quote!(#ty)
            };
            match &field.ident {
                Some(name) => quote!(#(#attrs)* #name: #ty),
                None => quote!(#(#attrs)* #ty),
            }
        })
        .collect()
}

/// The names of a variant's named fields.
fn field_names(fields: &syn::FieldsNamed) -> Vec<&Ident> {
    fields
        .named
        .iter()
        .filter_map(|field| field.ident.as_ref())
        .collect()
}

fn serialize_arm(ty_name: &str, v: &Variant<'_>) -> Tokens {
    let ident = v.ident;
    let name = &v.name;
    let tag = v.tag;
    let since = v.since.map(|since| {
        let message = format!("{ty_name}::{ident} needs protocol version {since} or later, and the peer speaks an older one");
        quote! {
            if ::weft_proto::wire::version() < #since {
                return ::core::result::Result::Err(::weft_proto::wire::too_new::<__S::Error>(#message));
            }
        }
    });
    match v.fields {
        Fields::Unit => quote! {
            Self::#ident => {
                #since
                __serializer.serialize_unit_variant(#ty_name, #tag, #name)
            }
        },
        Fields::Unnamed(fields)
            if fields.unnamed.len() == 1 && serde_attrs(&fields.unnamed[0].attrs).is_empty() =>
        {
            quote! {
                Self::#ident(__f0) => {
                    #since
                    __serializer.serialize_newtype_variant(#ty_name, #tag, #name, __f0)
                }
            }
        }
        Fields::Unnamed(fields) => {
            let bindings: Vec<Ident> = (0..fields.unnamed.len())
                .map(|i| format_ident!("__f{i}"))
                .collect();
            let helper_fields = helper_fields(&fields.unnamed, true);
            quote! {
                Self::#ident(#(#bindings),*) => {
                    #since
                    #[derive(::serde::Serialize)]
                    struct __Ref<'__w>(#(#helper_fields),*);
                    __serializer.serialize_newtype_variant(#ty_name, #tag, #name, &__Ref(#(#bindings),*))
                }
            }
        }
        Fields::Named(fields) => {
            let names = field_names(fields);
            let helper_fields = helper_fields(&fields.named, true);
            quote! {
                Self::#ident { #(#names),* } => {
                    #since
                    #[derive(::serde::Serialize)]
                    struct __Ref<'__w> { #(#helper_fields),* }
                    __serializer.serialize_newtype_variant(#ty_name, #tag, #name, &__Ref { #(#names),* })
                }
            }
        }
    }
}

fn deserialize_arm(ty: &Ident, v: &Variant<'_>) -> Tokens {
    let ident = v.ident;
    let tag = v.tag;
    match v.fields {
        Fields::Unit => quote! {
            #tag => {
                __variant.unit_variant()?;
                ::core::result::Result::Ok(#ty::#ident)
            }
        },
        Fields::Unnamed(fields)
            if fields.unnamed.len() == 1 && serde_attrs(&fields.unnamed[0].attrs).is_empty() =>
        {
            quote! {
                #tag => ::core::result::Result::Ok(#ty::#ident(__variant.newtype_variant()?)),
            }
        }
        Fields::Unnamed(fields) => {
            let bindings: Vec<Ident> = (0..fields.unnamed.len())
                .map(|i| format_ident!("__f{i}"))
                .collect();
            let helper_fields = helper_fields(&fields.unnamed, false);
            quote! {
                #tag => {
                    #[derive(::serde::Deserialize)]
                    struct __Own(#(#helper_fields),*);
                    let __Own(#(#bindings),*) = __variant.newtype_variant::<__Own>()?;
                    ::core::result::Result::Ok(#ty::#ident(#(#bindings),*))
                }
            }
        }
        Fields::Named(fields) => {
            let names = field_names(fields);
            let helper_fields = helper_fields(&fields.named, false);
            quote! {
                #tag => {
                    #[derive(::serde::Deserialize)]
                    struct __Own { #(#helper_fields),* }
                    let __Own { #(#names),* } = __variant.newtype_variant::<__Own>()?;
                    ::core::result::Result::Ok(#ty::#ident { #(#names),* })
                }
            }
        }
    }
}

fn enum_rename(attrs: &[Attribute]) -> syn::Result<Option<String>> {
    let mut rename_all = None;
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("wire")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all") {
                let value: LitStr = meta.value()?.parse()?;
                match value.value().as_str() {
                    "snake_case" | "kebab-case" | "lowercase" => {
                        rename_all = Some(value.value());
                        Ok(())
                    }
                    _ => Err(meta.error("rename_all is snake_case, kebab-case or lowercase")),
                }
            } else {
                Err(meta.error("an enum takes #[wire(rename_all = \"...\")]"))
            }
        })?;
    }
    if let Some(attr) = attrs.iter().find(|attr| attr.path().is_ident("serde")) {
        return Err(syn::Error::new_spanned(
            attr,
            "#[derive(Wire)] enums take #[wire(rename_all = ...)], not #[serde(...)]",
        ));
    }
    Ok(rename_all)
}

fn variant_attrs(attrs: &[Attribute], ident: &Ident) -> syn::Result<(u32, Option<u16>)> {
    // serde's attributes on a variant (rename, skip...) would be silently ignored here.
    if let Some(attr) = attrs.iter().find(|attr| attr.path().is_ident("serde")) {
        return Err(syn::Error::new_spanned(
            attr,
            "#[derive(Wire)] variants take #[wire(...)] only, not #[serde(...)]",
        ));
    }
    let (mut tag, mut since) = (None, None);
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("wire")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("tag") {
                tag = Some(meta.value()?.parse::<LitInt>()?.base10_parse::<u32>()?);
                Ok(())
            } else if meta.path.is_ident("since") {
                since = Some(meta.value()?.parse::<LitInt>()?.base10_parse::<u16>()?);
                Ok(())
            } else {
                Err(meta.error("a variant takes #[wire(tag = N)] and #[wire(since = VERSION)]"))
            }
        })?;
    }
    match tag {
        Some(tag) => Ok((tag, since)),
        None => Err(syn::Error::new_spanned(
            ident,
            "every variant needs its tag: #[wire(tag = N)], never reused",
        )),
    }
}

/// A variant's name in human-readable formats.
fn rename(name: &str, rule: Option<&str>) -> String {
    let words = || {
        let mut out = String::new();
        for (index, ch) in name.chars().enumerate() {
            if ch.is_uppercase() && index > 0 {
                out.push('_');
            }
            out.extend(ch.to_lowercase());
        }
        out
    };
    match rule {
        Some("snake_case") => words(),
        Some("kebab-case") => words().replace('_', "-"),
        Some("lowercase") => name.to_lowercase(),
        _ => name.to_string(),
    }
}
